"""Memory a sweep needs per case, from the case parameters alone (`attnbench sweep --dry-run`).

A case holds its pristine inputs while every backend runs on its own copy (harness/run/runner.py keeps each
backend's prepared closure, and so its copy, until timing), so its peak is at least
`inputs x (1 + backends)`, plus the float64 reference's outputs and timing's rotation buffers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Footprint:
    inputs: int  # bytes of one copy of the case's inputs and outputs (`Op.input_bytes`)
    peak: int  # inputs x (1 + backends that run it): the least the case holds at once
    runs: int  # backends that run the case (the others skip it: they copy nothing)


def footprint(case, backends: list) -> Footprint:
    from attnbench.run.runner import triage

    n = case.op.input_bytes(case.params, case.torch_dtype, case.seed)
    runs = len(triage(case, backends)[1])
    return Footprint(n, n * (1 + runs), runs)


def available(device: str) -> tuple[int, str] | None:
    """(free bytes, where) on the sweep's device: CUDA free memory of the first GPU, or the host's
    MemAvailable for `cpu`; None when it cannot be read."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return None
        index = torch.device(device).index or 0
        free, _ = torch.cuda.mem_get_info(index)
        return free, f"cuda:{index}"
    from attnbench.buffers import host_available_bytes

    host = host_available_bytes()
    return (host, "the host (MemAvailable)") if host is not None else None


def human(n: float) -> str:
    """Bytes in B, KiB, MiB or GiB (the largest unit it reaches; GiB above that)."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
