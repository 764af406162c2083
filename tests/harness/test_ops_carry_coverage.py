"""Ops carry their own smoke coverage (`Op.smoke`): the generator reads it from the op, nothing else."""

from __future__ import annotations

import pytest
from pydantic import Field

from attnbench.ops import OPS, coverage
from attnbench.ops.base import SmokeSpace


def test_every_op_declares_its_smoke_space_and_the_generator_reads_it():
    for name, op in OPS.items():
        assert isinstance(type(op).__dict__.get("smoke"), SmokeSpace), f"{name} declares no smoke space of its own"
        assert all(i.startswith(name + "/") for i in op.smoke.seed_ids), name


def test_an_op_s_new_values_reach_its_axes(monkeypatch):
    op = OPS["merge_state"]
    monkeypatch.setattr(type(op), "smoke", SmokeSpace(space=op.smoke.space | {"tokens": [5, 17, 33]}))
    axes = {ax.name: ax.values for ax in coverage.axes_for("merge_state")}
    assert axes["tokens"] == [5, 17, 33]


def test_a_field_neither_an_axis_nor_held_names_the_op_s_smoke_space(monkeypatch):
    op = OPS["merge_state"]

    class WithNumber(op.Params):
        splits: int = Field(1, ge=1)

    monkeypatch.setattr(op, "Params", WithNumber)
    with pytest.raises(KeyError, match="merge_state.splits: .* the op's `smoke` space"):
        coverage.axes_for("merge_state")
