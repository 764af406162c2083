"""Copies and moves of a case's inputs are freed when their last holder lets go, not at the next
cycle collection: a reference cycle holding a copy of an 8 GiB state pool is 8 GiB of GPU memory until
Python's collector runs (the `large` suite's GDN extend ran out of memory with nine pools alive, five
of them the stale-output check's garbage)."""

import gc
import weakref
from dataclasses import dataclass, field

import torch

from attnbench.buffers import all_tensors, clone_tensors, map_tensors
from attnbench.case import Case
from attnbench.ops.rng import to_device


@dataclass
class Inputs:
    pool: torch.Tensor
    view: torch.Tensor
    steps: list = field(default_factory=list)


def _inputs() -> Inputs:
    pool = torch.randn(4, 8)
    return Inputs(pool=pool, view=pool[1:3], steps=[{"k": torch.ones(3)}, (torch.zeros(2),)])


def _cyclic_garbage_of(make) -> int:
    """How many objects the cycle collector finds after `make()`'s result is dropped."""
    gc.collect()
    gc.disable()
    try:
        out = make()
        del out
        return gc.collect()
    finally:
        gc.enable()


def test_clone_tensors_leaves_no_cycle_and_its_copy_dies_with_its_holder():
    x = _inputs()
    assert _cyclic_garbage_of(lambda: clone_tensors(x)) == 0
    assert _cyclic_garbage_of(lambda: clone_tensors(x, only=["pool"])) == 0
    assert _cyclic_garbage_of(lambda: all_tensors(x)) == 0
    assert _cyclic_garbage_of(lambda: to_device(x, "meta")) == 0
    gc.disable()
    try:
        y = clone_tensors(x)
        gone = weakref.ref(y.pool)
        assert y.view.untyped_storage().data_ptr() == y.pool.untyped_storage().data_ptr()  # views stay views
        del y
        assert gone() is None  # freed by reference counting alone
    finally:
        gc.enable()


def test_map_tensors_rebuilds_containers_at_any_depth():
    x = _inputs()
    got = map_tensors([x.pool, {"a": (x.view, 3)}], lambda t: t + 1)
    assert torch.equal(got[0], x.pool + 1) and torch.equal(got[1]["a"][0], x.view + 1) and got[1]["a"][1] == 3


def test_a_real_gdn_case_copies_without_cycles():
    x = Case.from_id("gdn_extend/b2-t8-h2x4-d16x16-bf16", "cpu").make_inputs()
    assert _cyclic_garbage_of(lambda: clone_tensors(x)) == 0
