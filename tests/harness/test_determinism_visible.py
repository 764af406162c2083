"""Nondeterminism is visible: repeated enough to catch random-order reductions, fails declared promises,
`--require` on the command line, and a warning per backend in the console and summary.md."""

from __future__ import annotations

import torch
from typer.testing import CliRunner

from attnbench.check import checks
from attnbench.cli.app import app
from attnbench.kernels.mutants.interactions import Bugs, _RandomOrderPromisedDeterministic, attend
from attnbench.report.exports import determinism_warnings
from helpers import run_one

CASE = "decode/b3-l300-mixed-h8x2-d64-p16-bf16"


class Unpromised(_RandomOrderPromisedDeterministic):
    name = "random-order"
    deterministic = False


def test_declared_deterministic_backend_fails_when_it_is_not():
    row = run_one(CASE, _RandomOrderPromisedDeterministic())
    assert row.status == "fail" and row.deterministic is False
    assert "declares itself deterministic" in row.reason


def test_undeclared_nondeterminism_is_recorded_not_failed():
    row = run_one(CASE, Unpromised())
    assert row.status == "pass" and row.deterministic is False, row.reason


def test_a_difference_on_a_late_repeat_is_caught():
    """Two orders, the second drawn only on the 4th call: one repeat would miss it, the check does not."""
    calls = {"n": 0}

    class Late(Unpromised):
        name = "late"

        def prepare_decode(self, case, x):
            def run():
                calls["n"] += 1
                out = attend(x, Bugs())
                if calls["n"] == 4:
                    x.lse.add_(torch.where(torch.isfinite(x.lse), 2**-20, 0.0))
                return out

            return run

    assert checks.DETERMINISM_REPEATS >= 4
    row = run_one(CASE, Late())
    assert row.deterministic is False


def test_miss_probability_stated_matches_the_repeats():
    # (1/2)^repeats for a two-order random reduction: the docs and checks.py say at most 1/32
    assert 0.5**checks.DETERMINISM_REPEATS <= 1 / 32


def test_warnings_per_backend():
    row = run_one(CASE, Unpromised())
    lines = determinism_warnings([row])
    assert lines == [f"random-order: 1 row(s) not deterministic, e.g. {CASE}"]


def test_require_on_the_command_line(tmp_path):
    res = CliRunner().invoke(
        app,
        ["sweep", "--case", "merge_state/t17-h2-d32-bf16", "-b", "torch", "--no-timing", "--no-isolate",
         "--require", "deterministic,batch_invariant", "--out", str(tmp_path / "r"), "--device", "cpu"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    import json

    row = json.loads((tmp_path / "r" / "results.jsonl").read_text().splitlines()[0])
    assert row["batch_invariant"] is True and row["deterministic"] is True
    bad = CliRunner().invoke(app, ["sweep", "--case", "merge_state/t17-h2-d32-bf16", "--require", "fast"])
    assert bad.exit_code == 2 and "--require fast" in bad.output


def test_summary_md_and_console_carry_the_warning(tmp_path):
    from attnbench.report.exports import write_summary_md

    row = run_one(CASE, Unpromised())
    write_summary_md([row], tmp_path / "summary.md", {}, {})
    text = (tmp_path / "summary.md").read_text()
    assert "**warning** random-order: 1 row(s) not deterministic" in text


def test_console_summary_prints_the_warning(monkeypatch):
    from rich.console import Console

    from attnbench.cli import app as cli

    rec = Console(record=True, width=200)
    monkeypatch.setattr(cli, "console", rec)
    cli._print_summary([run_one(CASE, Unpromised())])
    assert "warning random-order: 1 row(s) not deterministic" in rec.export_text()


def test_padding_rows_may_differ_between_calls_but_real_rows_may_not():
    """A conv update writes what it likes into padding requests' rows of y (the contract leaves them open,
    `Op.unspecified`), a different value each call: still deterministic. The same noise in a real row
    is not (SGLang's padded update on an H100 was flagged by the first form of the check)."""
    from attnbench.backend import Backend
    from attnbench.kernels.torch import gdn as tgdn

    case_id = "causal_conv1d/b5-t1-c40-pad2-update-bf16"

    def noisy(padding: bool):
        calls = {"n": 0}

        class Noisy(Backend):
            name = "noisy-padding" if padding else "noisy-real-row"
            deterministic = False

            def prepare_causal_conv1d(self, case, x):
                def run():
                    out = tgdn.causal_conv1d(x)
                    calls["n"] += 1
                    rows = (
                        (x.cache_indices < 0).nonzero().flatten()
                        if padding
                        else (x.cache_indices >= 0).nonzero()[:1, 0]
                    )
                    x.y[rows] = float(calls["n"])  # another value on every call
                    return out

                return run

        return Noisy()

    assert run_one(case_id, noisy(padding=True)).deterministic is True
    assert run_one(case_id, noisy(padding=False)).deterministic is False
