"""The smoke suite is the generated all-pairs coverage of every op's parameter space."""

from __future__ import annotations

import itertools
from typing import Literal

import pytest
from pydantic import Field

from attnbench.ops import OPS, coverage
from attnbench.plan.suite import load


@pytest.fixture(scope="module")
def plans():
    return {name: coverage.generate(name) for name in OPS}


def test_committed_smoke_is_the_generators_output():
    assert coverage.smoke_path().read_text() == coverage.smoke_yaml(), (
        "suites/smoke.yaml is stale: run `python -m attnbench.ops.coverage --write`"
    )


def test_every_allowed_pair_is_covered_by_a_smoke_case(plans):
    cases = load("smoke").cases
    for name, cov in plans.items():
        mine = [c for c in cases if c.op_name == name]
        got = set()
        for c in mine:
            values = c.params.model_dump() | {"dtype": c.dtype}
            items = []
            for ax in cov.axes:
                v = tuple(values[f] for f in ax.fields) if len(ax.fields) > 1 else values[ax.name]
                items.append((ax.name, v))
            got.update(itertools.combinations(items, 2))
        missing = set(cov.pairs()) - set(cov.forbidden) - got
        assert not missing, f"{name}: {sorted(missing, key=str)[:5]}"


def test_forbidden_pairs_are_rejected_by_validation_with_a_reason(plans):
    assert plans["extend"].forbidden  # e.g. empty_rows without a custom mask
    for cov in plans.values():
        for pair, why in cov.forbidden.items():
            assert why and why != "no valid completion found", (cov.op, pair)


def test_numeric_edges_and_features_are_in_smoke():
    ids = [c.id for c in load("smoke").cases]
    assert any(i.startswith("decode/") and "-l4000-" in i for i in ids)
    assert any("kvscalehead" in i for i in ids) and any("emptyrows" in i and "sink" in i for i in ids)
    assert any("-mla-" in i and "swa" in i for i in ids)


def test_a_new_parameter_is_an_axis_by_construction(monkeypatch):
    op = OPS["merge_state"]

    class WithFlag(op.Params):
        layout: Literal["a", "b", "c"] = "a"

    monkeypatch.setattr(op, "Params", WithFlag)
    axes = {ax.name: ax.values for ax in coverage.axes_for("merge_state")}
    assert axes["layout"] == ["a", "b", "c"]

    class WithNumber(op.Params):
        splits: int = Field(1, ge=1)

    monkeypatch.setattr(op, "Params", WithNumber)
    with pytest.raises(KeyError, match="merge_state.splits"):
        coverage.axes_for("merge_state")


def test_coverage_report_names_pairs_and_forbidden(plans):
    text = coverage.describe("extend")
    assert "allowed pairs covered" in text and "forbidden mask=causal with empty_rows=True" in text


def test_list_ops_coverage_on_the_command_line():
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    res = CliRunner().invoke(app, ["list", "ops", "--coverage"])
    assert res.exit_code == 0 and "decode:" in res.output and "allowed pairs covered" in res.output
    assert "forbidden mask=causal with empty_rows=True: empty_rows needs mask: custom" in res.output
