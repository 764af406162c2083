"""Every deliberately broken backend is flagged by the checks; the torch backend passes the same cases."""

from __future__ import annotations

import pytest

from attnbench.backend import get_backend
from attnbench.kernels.mutants import MUTANTS
from helpers import run_one


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_caught_and_torch_passes(mutant):
    for case_id in mutant.cases:
        good = run_one(case_id, get_backend("torch"))
        assert good.status == "pass", f"torch on {case_id}: {good.reason}"
        bad = run_one(case_id, mutant.backend())
        assert bad.status == "fail", f"{mutant.name} ({mutant.bug}) not caught on {case_id}: {bad.status} {bad.reason}"


def test_reasons_name_the_failure():
    by = {m.name: m for m in MUTANTS}
    expect = {
        "write-past-output": "canary",
        "stale-cached-output": "stale output",
        "read-past-seq-len": "NaN",
        "kv-not-saved": "not written",
        "input-modified": "input q was modified",
        "nan-on-empty-rows": "NaN",
    }
    for name, words in expect.items():
        m = by[name]
        row = run_one(m.cases[0], m.backend())
        assert words in row.reason, f"{name}: {row.reason}"


def test_selftest_command_passes():
    from typer.testing import CliRunner

    from attnbench.cli import app

    res = CliRunner().invoke(app, ["selftest"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    import re

    from attnbench.kernels.mutants import MUTANTS

    n = sum(len(m.cases) for m in MUTANTS)
    assert re.search(rf"\b{n}/{n} ok", res.output), res.output[-500:]
