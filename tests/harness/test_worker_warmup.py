"""Workers start while the supervisor precompiles, and import the sweep's backends' libraries
(`available()`) before they say Ready: on an H100 the first case of a warm `ci` sweep paid 18 s of
such imports (SGLang, CuTe DSL, FlashInfer) inside its triage, after the supervisor had paid them
once in its precompile, one after the other."""

from __future__ import annotations

import json
import os
import textwrap

from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.results import read_results

PLUGIN = textwrap.dedent("""
    import json, os, time
    import attnbench
    from attnbench.kernels.torch import TorchBackend

    SUPERVISOR, MARKS = int(os.environ["WARM_SUPERVISOR"]), os.environ["WARM_MARKS"]

    @attnbench.register_backend("slow-import")
    class SlowImport(TorchBackend):
        _imported = False
        def available(self):
            if os.getpid() != SUPERVISOR and not SlowImport._imported:  # a worker imports its library
                time.sleep(float(os.environ.get("WARM_IMPORT_S", "0")))
                SlowImport._imported = True
                with open(os.path.join(MARKS, f"imported-{os.getpid()}"), "w") as f:
                    f.write(str(time.time()))
            return None
        def precompile_keys(self, cases):
            return ["k"]
        @classmethod
        def precompile(cls, keys):  # waits (up to a minute) for a worker to have imported during it
            t0 = time.time()
            while time.time() - t0 < 60:
                if any(n.startswith("imported-") for n in os.listdir(MARKS)):
                    return "a worker imported during the precompile"
                time.sleep(0.05)
            return "no worker imported during the precompile"
""")


def _sweep(tmp_path, monkeypatch, import_s: float):
    plugin = tmp_path / "slow.py"
    plugin.write_text(PLUGIN)
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("WARM_SUPERVISOR", str(os.getpid()))
    monkeypatch.setenv("WARM_MARKS", str(marks))
    monkeypatch.setenv("WARM_IMPORT_S", str(import_s))
    out = tmp_path / "run"
    args = ["sweep", "--plugin", str(plugin), "-b", "slow-import", "--case", "merge_state/t8-h2-d16-bf16",
            "--device", "cpu", "--no-timing", "--ref-cache", "off", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out, json.loads((out / "run.json").read_text())


def test_workers_import_the_backends_while_the_supervisor_precompiles(tmp_path, monkeypatch):
    out, run = _sweep(tmp_path, monkeypatch, 0.0)
    (rec,) = run["precompile"]
    assert rec["summary"] == "a worker imported during the precompile"
    assert run["costs"]["worker_start_hidden_s"] > 0
    assert [r.status for r in read_results(out / "results.jsonl")] == ["pass"]


def test_a_library_import_is_worker_start_up_not_the_first_cases_time(tmp_path, monkeypatch):
    out, run = _sweep(tmp_path, monkeypatch, 3.0)
    (row,) = read_results(out / "results.jsonl")
    assert row.status == "pass" and row.case_s < 2.5, row.case_s
    costs = run["costs"]
    assert costs["worker_start_s"] + costs["worker_start_hidden_s"] >= 3.0, costs
