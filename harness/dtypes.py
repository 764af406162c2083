"""Working dtypes by their suite names (`fp32`, `fp16`, `bf16`) and their unit roundoff."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


def to_torch(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}") from None


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half an ulp at 1.0: 2^-24 (fp32), 2^-11 (fp16), 2^-8 (bf16)."""
    return torch.finfo(dtype).eps / 2
