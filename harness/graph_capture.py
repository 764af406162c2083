"""CUDA-graph capture that leaves the process usable when a capture fails.

A capture that raises (a host sync inside, an allocation the capture forbids) leaves the device's
default CUDA generators marked as capturing: in torch 2.11 every later random op on that device then
raises "Offset increment outside graph capture encountered unexpectedly" (seen on an H200,
2026-11-28: a timing test's failed capture broke the next test's `torch.randn`). A sweep captures
every backend of a case, and a backend that cannot be captured is a normal outcome (timed per call,
its replay check reported), so the failure must not leak into the next backend or case.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, **kwargs) -> Iterator[None]:
    """`torch.cuda.graph(graph, **kwargs)`; if the capture fails, each default CUDA generator is given a
    fresh copy of its own state (same seed and offset, not capturing) before the error propagates."""
    try:
        with torch.cuda.graph(graph, **kwargs):
            yield
    except BaseException:
        reset_generators()
        raise


def reset_generators() -> None:
    """Replace every default CUDA generator's state by a copy of it that is not marked as capturing."""
    for gen in torch.cuda.default_generators:
        gen.graphsafe_set_state(gen.clone_state())
