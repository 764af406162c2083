"""Import guard for vLLM's Triton attention (vllm 0.33.0, installed with --no-deps; its compiled
extensions are not needed by these kernels)."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util

PINNED = "0.33.0"
UNIFIED = "vllm.v1.attention.ops.triton_unified_attention"
INSTALL = "install it without replacing torch: tools/install-deployed.sh vllm (a 336 MB wheel; docs/deployed.md)"


@functools.cache
def missing() -> str | None:
    """Why vLLM's Triton unified attention cannot be imported here (None: it can)."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"vllm is not installed; {INSTALL}"
    try:
        importlib.import_module(UNIFIED)
    except ModuleNotFoundError as e:
        return f"vllm's Triton attention does not import (No module named {e.name!r}); {INSTALL}"
    except Exception as e:
        return f"vllm's Triton attention does not import ({type(e).__name__}: {e}); {INSTALL}"
    return None


def unified_attention():
    return importlib.import_module(UNIFIED).unified_attention
