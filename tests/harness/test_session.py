"""One session for every entry point (harness/run/session.py): a suite with a known failure gets the same
statuses from `attnbench sweep` and from `pytest --attnbench`, expectations applied both ways."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

# torch's merge_state, its output zeroed on two cases: one listed as a known failure, one not
PLANTED = """
import attnbench
from attnbench.kernels.torch import TorchBackend

BROKEN = {"merge_state/t33-h4-d64-fp32", "merge_state/t17-h2-d32-fp16"}

@attnbench.register_backend("planted")
class Planted(TorchBackend):
    def prepare_merge_state(self, case, x):
        inner = super().prepare_merge_state(case, x)
        def run():
            out = inner()
            if case.id in BROKEN:
                out["o"].zero_()
            return out
        return run
"""

# the broken case is a known failure (xfail); a case that passes is listed too (xpass: the run fails)
EXPECT = """
expect:
  - backend: planted
    cases: [merge_state/t33-h4-d64-fp32, merge_state/t33-h4-d64-bf16]
    why: planted known failure
"""

_OUTCOME = {"pass": "PASSED", "xfail": "XFAIL", "fail": "FAILED", "error": "FAILED", "xpass": "FAILED"}


def test_sweep_and_pytest_give_a_suite_with_a_known_failure_the_same_statuses(tmp_path):
    (tmp_path / "planted.py").write_text(PLANTED, encoding="utf-8")
    (tmp_path / "expect.yaml").write_text(EXPECT, encoding="utf-8")
    run = lambda *a: subprocess.run([sys.executable, "-m", *a], cwd=tmp_path, capture_output=True, text=True,
                                    timeout=900)  # fmt: skip
    swept = run("attnbench", "sweep", "smoke", "--op", "merge_state", "--device", "cpu", "-b", "torch", "-b", "planted",
                "--plugin", "planted.py", "--expect", "expect.yaml", "--out", "run")  # fmt: skip
    assert swept.returncode == 1, swept.stdout + swept.stderr  # the xpass and the plain fail
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    statuses = {(r["case_id"], r["backend"]): r["status"] for r in rows}
    assert statuses[("merge_state/t33-h4-d64-fp32", "planted")] == "xfail"
    assert statuses[("merge_state/t33-h4-d64-bf16", "planted")] == "xpass"
    assert statuses[("merge_state/t17-h2-d32-fp16", "planted")] == "fail"

    tested = run("pytest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-rA", "--attnbench", "smoke", "-k", "merge_state",
                 "--attnbench-device", "cpu", "--attnbench-backend", "torch", "--attnbench-backend", "planted",
                 "--attnbench-plugin", "planted.py", "--attnbench-expect", "expect.yaml")  # fmt: skip
    assert tested.returncode == 1, tested.stdout + tested.stderr
    found = re.findall(r"^(PASSED|FAILED|XFAIL|SKIPPED) attnbench:smoke::(\S+)\[(\S+?)\]", tested.stdout, re.M)
    outcomes = {(case, backend): outcome for outcome, case, backend in found}
    assert outcomes == {key: _OUTCOME[s] for key, s in statuses.items()}, tested.stdout


def test_the_cli_builds_one_typed_options_object(monkeypatch, tmp_path):
    """`attnbench sweep`'s flags become one SweepOptions (selection for the plan, execution, run options,
    run directory); the command itself only parses."""
    from typer.testing import CliRunner

    from attnbench.cli import app as cli
    from attnbench.run.sweep import Selection, SweepOptions

    got = []
    monkeypatch.setattr(cli, "_run_sweep", got.append)
    args = ["sweep", "smoke", "-b", "torch", "--op", "merge_state", "-k", "t33", "--device", "cpu", "--shard", "1/2",
            "--no-isolate", "--timeout", "30", "--require", "deterministic", "--no-expect", "--out", str(tmp_path)]  # fmt: skip
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 0, res.output
    [o] = got
    assert o == SweepOptions(
        Selection(("smoke",), "cpu", ("torch",), ("merge_state",), ("t33",), shard=(1, 2), expect=False,
                  require=("deterministic",)),
        out=tmp_path, isolate=False, timeout_s=30.0,
    )  # fmt: skip
    assert o.execution(("cpu",), "").isolate is False and o.execution(("cpu",), "").timeout_s == 30.0


def test_sweep_options_refuse_what_cannot_run():
    from attnbench.errors import AttnbenchError
    from attnbench.run.sweep import Selection, SweepOptions

    for bad, says in ((SweepOptions(timeout_s=0), "--timeout"), (SweepOptions(Selection(max_cases=0)), "--max-cases"),
                      (SweepOptions(resume=True), "--resume needs --out")):  # fmt: skip
        with pytest.raises(AttnbenchError, match=says):
            bad.check()
