"""`Backend.precompile`: a backend family's batched compilation runs once, before the cases, over the
keys every member needs (without duplicates); its time is in run.json and the report; a failure is
reported and the sweep goes on."""

from __future__ import annotations

import json
import textwrap

from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.store.results import read_results

PLUGIN = textwrap.dedent("""
    import json, os
    import attnbench
    from attnbench.kernels.torch import TorchBackend

    LOG = os.environ["PRECOMPILE_LOG"]

    class Family(TorchBackend):
        variant = ""
        def precompile_keys(self, cases):
            return [(c.params.head_dim, str(c.dtype), self.variant) for c in cases] + [("shared",)]
        @classmethod
        def precompile(cls, keys):
            with open(LOG, "a") as f:
                f.write(json.dumps(sorted(json.dumps(k) for k in keys)) + "\\n")
            if os.environ.get("PRECOMPILE_FAIL"):
                raise RuntimeError("nvcc exploded")
            return f"built {len(keys)}"

    @attnbench.register_backend("fam-a")
    class A(Family):
        variant = "a"

    @attnbench.register_backend("fam-b")
    class B(Family):
        variant = "b"
        def supports(self, case):
            return "b skips fp32" if "fp32" in case.id else super().supports(case)
""")

CASES = ["merge_state/t8-h2-d16-bf16", "merge_state/t9-h2-d16-fp32"]


def _sweep(tmp_path, monkeypatch, *extra):
    plugin = tmp_path / "family.py"
    plugin.write_text(PLUGIN)
    log = tmp_path / "precompile.log"
    monkeypatch.setenv("PRECOMPILE_LOG", str(log))
    out = tmp_path / "run"
    args = ["sweep", "--plugin", str(plugin), "-b", "fam-a", "-b", "fam-b", "-b", "torch", "--out", str(out),
            "--device", "cpu", "--no-timing", *extra]  # fmt: skip
    for c in CASES:
        args += ["--case", c]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    return res, out, log


def test_a_family_is_compiled_once_with_the_union_of_its_keys(tmp_path, monkeypatch):
    res, out, log = _sweep(tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    keys = sorted(json.dumps(k) for k in ([16, "bf16", "a"], [16, "fp32", "a"], [16, "bf16", "b"], ["shared"]))
    assert calls == [keys]  # one call; supported cases only; no duplicates; torch has none
    run = json.loads((out / "run.json").read_text())
    (rec,) = run["precompile"]
    assert rec["backends"] == ["fam-a", "fam-b"] and rec["keys"] == 4 and rec["summary"] == "built 4"
    assert rec["s"] >= 0 and run["wall_s"] >= rec["s"]
    assert (
        "precompile (available(), supports(), what to build; batched JIT before the cases)"
        in (out / "report.html").read_text()
    )
    assert {r.status for r in read_results(out / "results.jsonl")} == {"pass", "skip"}


def test_a_failed_precompile_is_reported_and_the_cases_still_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PRECOMPILE_FAIL", "1")
    res, out, _ = _sweep(tmp_path, monkeypatch, "--no-isolate")
    assert res.exit_code == 0, res.output
    assert "precompile for fam-a, fam-b failed" in res.output and "nvcc exploded" in res.output
    (rec,) = json.loads((out / "run.json").read_text())["precompile"]
    assert "nvcc exploded" in rec["error"]
    assert len(read_results(out / "results.jsonl")) == 6
