"""Every deliberately broken backend is flagged by the checks; the torch backend passes the same cases."""

from __future__ import annotations

import dataclasses

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


def test_selftest_catches_every_mutant_with_the_default_suites():
    """Every mutant is caught by a smoke case (the first one is reported), and torch passes them all."""
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    res = CliRunner().invoke(app, ["selftest"], catch_exceptions=False)
    n, k = len(MUTANTS), sum(bool(m.known_escape or m.cuda_only) for m in MUTANTS)  # a CPU run: cuda_only escapes
    assert f"mutation score {n - k}/{n} = " in res.output, res.output[-3000:]
    assert res.output.count("known escape: ") == k, res.output[-3000:]
    assert res.exit_code == 0, res.output[-3000:]


def test_at_least_15_mutants_have_no_case_written_for_them():
    assert sum(not m.cases for m in MUTANTS) >= 15
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)


def test_upstream_mutants_cite_a_real_bug_and_have_no_case_written_for_them():
    """kernels/mutants/upstream.py: each names an upstream issue or PR; the suites must find it unaided."""
    import re

    from attnbench.kernels.mutants.upstream import UPSTREAM_MUTANTS

    assert len(UPSTREAM_MUTANTS) >= 8
    by = {m.name: m for m in MUTANTS}
    for u in UPSTREAM_MUTANTS:
        assert re.match(r"[\w.-]+/[\w.-]+ (PR|issue) #\d+", u.source), u.source
        assert by[u.name].source == u.source and by[u.name].cases == ()


def test_selftest_reports_a_mutant_the_suites_miss(monkeypatch):
    """A mutant no default case can catch (a correct backend in disguise) lowers the score and fails."""
    from attnbench.cli import selftest
    from attnbench.kernels import mutants
    from attnbench.kernels.torch import TorchBackend

    disguised = type("Harmless", (TorchBackend,), {"name": "harmless"})
    harmless = mutants.Mutant("harmless", "no bug at all", (), disguised)
    monkeypatch.setattr(mutants, "MUTANTS", (harmless,))
    monkeypatch.setattr(selftest, "DEFAULT_SUITES", ("smoke",))
    from attnbench.plan.suite import load

    small = load("smoke")
    small.cases = [c for c in small.cases if c.op_name == "gdn_gating"]
    for where in ("attnbench.plan.suite.load", "attnbench.run.sweep.load"):  # selftest plans through sweep.plan
        monkeypatch.setattr(where, lambda name, *args, **kwargs: small)
    rep = selftest.run()
    assert rep.caught == 0 and rep.score == 0.0 and not rep.ok
    assert rep.outcomes[0].cases_run == len(small.cases)


def test_a_known_escape_is_shown_and_fails_once_caught(monkeypatch):
    """A mutant marked as a known escape keeps the self-test green while missed (and counts as missed);
    once the suites catch it the self-test fails until the mark is removed."""
    from attnbench.cli import selftest
    from attnbench.kernels import mutants
    from attnbench.kernels.torch import TorchBackend
    from attnbench.plan.suite import load

    small = load("smoke")
    small.cases = [c for c in small.cases if c.op_name == "gdn_gating"][:2]
    for where in ("attnbench.plan.suite.load", "attnbench.run.sweep.load"):  # selftest plans through sweep.plan
        monkeypatch.setattr(where, lambda name, *args, **kwargs: small)
    disguised = type("Harmless", (TorchBackend,), {"name": "harmless"})
    missed = mutants.Mutant("harmless", "no bug at all", (), disguised, known_escape="nothing to find")
    monkeypatch.setattr(mutants, "MUTANTS", (missed,))
    rep = selftest.run()
    assert rep.ok and rep.caught == 0 and rep.known_escapes == 1 and rep.score == 0.0
    by = {m.name: m for m in MUTANTS}
    found = dataclasses.replace(by["dt-bias-head0"], known_escape="was missed once")
    monkeypatch.setattr(mutants, "MUTANTS", (found,))
    rep = selftest.run()
    assert rep.caught == 1 and rep.known_escapes == 0 and not rep.ok


def test_a_mutant_that_only_raises_is_not_caught_and_says_why(monkeypatch):
    """An error row proves nothing about the checks: the mutant stays uncaught, with the error as the reason."""
    from attnbench.backend import Backend
    from attnbench.cli import selftest
    from attnbench.kernels import mutants
    from attnbench.plan.suite import load

    small = load("smoke")
    small.cases = [c for c in small.cases if c.op_name == "gdn_gating"][:1]
    for where in ("attnbench.plan.suite.load", "attnbench.run.sweep.load"):  # selftest plans through sweep.plan
        monkeypatch.setattr(where, lambda name, *args, **kwargs: small)

    def prepare(self, case, x):
        def run():
            raise RuntimeError("kernel crashed")

        return run

    raising = type("Raising", (Backend,), {"name": "raising", "prepare_gdn_gating": prepare})
    monkeypatch.setattr(mutants, "MUTANTS", (mutants.Mutant("raising", "raises", (), raising),))
    rep = selftest.run()
    o = rep.outcomes[0]
    assert not o.caught and not rep.ok
    assert o.reason.startswith("error (not a catch) on gdn_gating/") and "kernel crashed" in o.reason, o.reason
