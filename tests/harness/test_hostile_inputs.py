"""A battery of hostile inputs (issue #30): broken plugins, loosened suites, torn results files,
concurrent runs. Each must end in one clear line and the right exit code, never in a green verdict
where nothing was verified. One parametrised test per family: its input, exit code and message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import synthetic
from attnbench.cli.app import app

runner = CliRunner()
CASE = "merge_state/t9-h2-d16-fp32"  # a small smoke case the torch backend passes on a CPU


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


# ---- plugins ---------------------------------------------------------------------------------------

PLUGINS = {
    "sys.exit(main()) at import": "import sys\n\ndef main():\n    return 0\n\nsys.exit(main())\n",
    "sys.exit(3) at import": "import sys\nsys.exit(3)\n",
    "a bare BaseException at import": "raise BaseException('plugin gave up')\n",
    "a plugin taking the name torch": (
        "import attnbench\nfrom attnbench.kernels.torch import TorchBackend as Base\n\n"
        "@attnbench.register_backend('torch')\nclass TorchBackend(Base):\n    pass\n"
    ),
    "a plugin taking the name triton with another class": (
        "import attnbench\nfrom attnbench.kernels.torch import TorchBackend\n\n"
        "@attnbench.register_backend('triton')\nclass Mine(TorchBackend):\n    pass\n"
    ),
}
PLUGIN_MESSAGES = {
    "sys.exit(main()) at import": "SystemExit(0) while importing it",
    "sys.exit(3) at import": "SystemExit(3) while importing it",
    "a bare BaseException at import": "BaseException: plugin gave up",
    "a plugin taking the name torch": "backend name 'torch' is taken by attnbench.kernels.torch.TorchBackend",
    "a plugin taking the name triton with another class": "backend name 'triton' is taken by attnbench.kernels.triton",
}


@pytest.mark.parametrize("command", ["sweep", "list backends", "profile"])
@pytest.mark.parametrize("what", list(PLUGINS))
def test_a_plugin_that_does_not_load_is_exit_2_naming_its_file(tmp_path, what, command):
    plugin = tmp_path / "broken_plugin.py"
    plugin.write_text(PLUGINS[what])
    args = {
        "sweep": ["sweep", "--case", CASE, "-b", "torch", "--device", "cpu", "--no-isolate", "--out", tmp_path / "r"],
        "list backends": ["list", "backends", "--device", "cpu"],
        "profile": ["profile", CASE, "-b", "torch", "--device", "cpu"],
    }[command]
    res = invoke(*args, "--plugin", plugin)
    assert res.exit_code == 2, res.output
    assert f"plugin {plugin}" in res.output and PLUGIN_MESSAGES[what] in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "r").exists()
    if "taking the name" in what:  # both modules are named
        assert "attnbench_plugin_broken_plugin" in res.output


def test_a_module_imported_again_registers_its_backend_again():
    """Re-importing (reloading) the module that registered a name is not a clash."""
    import importlib
    import sys

    from attnbench import backend

    mod = importlib.import_module("attnbench.kernels.torch")
    importlib.reload(mod)
    assert backend.all_backends()["torch"].__class__.__module__ == "attnbench.kernels.torch"
    assert sys.modules["attnbench.kernels.torch"] is mod


# ---- suites ----------------------------------------------------------------------------------------

SUITE = (
    'cases:\n  - op: merge_state\n    sweep: {{tokens: [9]}}\n    tolerance: {{{tol}, why: "a reviewer reads this"}}\n'
)


@pytest.mark.parametrize(
    "tol, message",
    [
        ("factor: .inf", "factor: must be a finite number, got inf"),
        ("floor: .inf", "floor: must be a finite number, got inf"),
        ("factor: .nan", "factor: must be a finite number, got nan"),
        ("floor: .nan", "floor: must be a finite number, got nan"),
        ("floor: '-inf'", "floor: must be a finite number, got -inf"),
        ("factor: 1e9", "factor: 1e+09 loosens the tolerance beyond the most a suite may (16"),
        ("factor: 16.5", "factor: 16.5 loosens the tolerance beyond the most a suite may (16"),
        ("floor: 1000", "floor: 1000 loosens the tolerance beyond the most a suite may (16"),
    ],
)
def test_a_tolerance_that_is_not_finite_or_too_loose_is_refused_at_its_line(tmp_path, tol, message):
    suite = tmp_path / "loose.yaml"
    suite.write_text(SUITE.format(tol=tol))
    res = invoke("sweep", suite, "--device", "cpu", "--dry-run")
    assert res.exit_code == 2, res.output
    assert f"{suite}:4: cases[0].tolerance.{message}" in res.output, res.output
    assert "Traceback" not in res.output


def test_the_largest_allowed_tolerance_loads(tmp_path):
    suite = tmp_path / "loose.yaml"
    suite.write_text(SUITE.format(tol="factor: 16, floor: 16"))
    assert invoke("sweep", suite, "--device", "cpu", "--dry-run").exit_code == 0


@pytest.mark.parametrize(
    "args",
    [
        ["smoke", "smoke", "--op", "merge_state"],
        ["smoke", "--op", "merge_state", "--case", "merge_state/t33-h4-d64-fp32"],
        ["--case", CASE, "--case", CASE],
    ],
    ids=["the same suite twice", "a suite and one of its cases", "the same --case twice"],
)
def test_repeated_suites_and_cases_are_planned_once(args):
    from attnbench.run.sweep import Selection, plan

    suites = [a for a in args if a == "smoke"]
    cases = [a for i, a in enumerate(args) if i and args[i - 1] == "--case"]
    p = plan(Selection(tuple(suites), "cpu", ("torch",), ("merge_state",), case_ids=tuple(cases)))
    ids = [c.id for c in p.cases]
    assert len(ids) == len(set(ids)) and set(cases) <= set(ids)
    if suites:  # the suite's order, the first occurrence kept
        from attnbench.plan.suite import load

        assert ids == [c.id for c in load("smoke", "cpu").cases if c.op_name == "merge_state"]
    res = invoke("sweep", *args, "-b", "torch", "--device", "cpu", "--dry-run")
    assert res.exit_code == 0 and res.output.startswith(f"{len(ids)} cases x 1 backends"), res.output


# ---- runs that verified nothing ----------------------------------------------------------------------

NO_CUDA = "no CUDA device (set TRITON_INTERPRET=1"


@pytest.mark.parametrize(
    "backends, code, messages",
    [
        (
            ["triton"],
            1,
            ["error: nothing ran: all 1 rows skipped", f"error: triton skipped all 1 of its rows: {NO_CUDA}"],
        ),
        (["triton*"], 1, ["error: nothing ran: all 2 rows skipped", "error: triton-det skipped all 1"]),
        (["torch", "triton"], 1, [f"error: triton (named with -b) skipped all 1 of its rows: {NO_CUDA}"]),
        (["torch", "triton*"], 1, ["error: -b 'triton*': none of the backends it matched ran a case (triton: no CUDA"]),
        (["torch", "flashinfer*"], 1, ["error: -b 'flashinfer*': none of the backends it matched ran a case"]),
        (["torch"], 0, ["OK: nothing failing"]),
        (["torch", "triton", "--allow-skipped"], 0, ["note: triton (named with -b) skipped all 1 of its rows"]),
        (["triton*", "--allow-skipped"], 0, ["note: nothing ran: all 2 rows skipped"]),
    ],
    ids=[
        "one name",
        "a pattern",
        "one of two names",
        "one of two patterns",
        "a library pattern",
        "torch alone",
        "allowed",
        "allowed, nothing ran",
    ],  # fmt: skip
)
def test_a_run_that_verified_nothing_named_fails_sweep_and_gate(tmp_path, monkeypatch, backends, code, messages):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # triton then skips on a CPU, saying why
    args = [a if a.startswith("--") else f"-b{a}" for a in backends]
    out = tmp_path / "run"
    res = invoke("sweep", "--case", CASE, *args, "--device", "cpu", "--no-timing", "--no-isolate", "--out", out)
    assert res.exit_code == code, res.output
    for m in messages:
        assert m in res.output, res.output
    allow = ["--allow-skipped"] if "--allow-skipped" in backends else []
    gate = invoke("gate", out, *allow)
    assert gate.exit_code == code, gate.output
    if code:
        assert messages[-1].removeprefix("error: ") in gate.output and "gate: fail" in gate.output, gate.output


def test_the_default_cpu_sweep_of_one_case_passes_with_its_skips(tmp_path):
    """The README's command names no backend: backends that cannot run here skip without failing it."""
    res = invoke("sweep", "--case", CASE, "--device", "cpu", "--no-timing", "--no-isolate", "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    assert invoke("gate", tmp_path / "r").exit_code == 0


# ---- results files that do not hold what run.json says ------------------------------------------------


def _recorded_run(path: Path, n: int = 3) -> Path:
    rows = [synthetic.row(f"decode/b{b}-l1024-h32x8-d128-bf16", "torch") for b in range(1, n + 1)]
    run = {"argv": ["attnbench", "sweep"], "device": "cuda", "complete": True, "rows": n, "wall_s": 1.0}
    return synthetic.write_run(path, rows, run=run)


def _keep_lines(run: Path, keep) -> None:
    lines = (run / "results.jsonl").read_text().splitlines(keepends=True)
    (run / "results.jsonl").write_text("".join(keep(lines)))


TORN = {
    "a row torn off the end": (lambda lines: lines[:-1], "holds 2 rows but run.json recorded 3: 1 rows are missing"),
    "an emptied results file": (lambda lines: [], "holds 0 rows but run.json recorded 3: 3 rows are missing"),
    "every row written twice": (lambda lines: lines + lines, "holds 6 rows but run.json recorded 3"),
}


@pytest.mark.parametrize("what", list(TORN))
def test_results_that_lack_rows_fail_the_gate_and_are_said_by_compare_and_report(tmp_path, what):
    keep, message = TORN[what]
    run = _recorded_run(tmp_path / "new")
    base = _recorded_run(tmp_path / "base")
    assert invoke("gate", run).exit_code == 0
    _keep_lines(run, keep)
    res = invoke("gate", run)
    assert res.exit_code == 1 and message in res.output, res.output
    res = invoke("gate", tmp_path / "base", "--baseline", run, "--allow-missing")
    assert res.exit_code == 1 and f"baseline {run}: results.jsonl {message}" in res.output, res.output
    res = invoke("compare", base, run, "--allow-missing")
    assert res.exit_code == 1 and f"{run}: results.jsonl {message}" in res.output, res.output
    res = invoke("report", run)
    assert res.exit_code == 0 and f"warning: {run}: results.jsonl {message}" in res.output, res.output
    assert f"results.jsonl {message}" in (run / "summary.md").read_text()
    assert 'id="missing-rows"' in (run / "report.html").read_text()


# ---- loosened tolerances are shown -------------------------------------------------------------------


def test_a_loosened_tolerance_is_shown_on_the_console_in_summary_md_and_the_report(tmp_path):
    suite = tmp_path / "loose.yaml"
    suite.write_text(
        "cases:\n  - op: merge_state\n    sweep: {tokens: [9, 17]}\n    dtypes: [fp32]\n"
        '    tolerance: {factor: 8, why: "the <b>vendor</b> kernel sums in fp16"}\n'
    )
    out = tmp_path / "run"
    res = invoke("sweep", suite, "-b", "torch", "--device", "cpu", "--no-timing", "--no-isolate", "--out", out)
    assert res.exit_code == 0, res.output
    line = "loose/merge_state, 2 cases: factor 8 (default 2); why: the <b>vendor</b> kernel sums in fp16"
    assert f"loosened tolerance: {line}" in res.output, res.output
    md = (out / "summary.md").read_text()
    assert "**Loosened tolerances**" in md and "factor 8 (default 2); why: the &lt;b&gt;vendor&lt;/b&gt;" in md
    first = (out / "report.html").read_text().split('<section id="verdict">')[0]  # above the verdict
    assert 'id="loosened"' in first and "factor 8 (default 2); why: the &lt;b&gt;vendor&lt;/b&gt; kernel" in first


# ---- two sweeps into one run directory ------------------------------------------------------------------


def test_a_second_sweep_into_a_run_directory_in_use_is_refused(tmp_path):
    from attnbench.store.rundir import lock_run_dir

    out = tmp_path / "run"
    out.mkdir()
    held = lock_run_dir(out)  # another sweep writing there now
    try:
        for extra in ([], ["--overwrite"], ["--resume"]):
            res = invoke("sweep", "--case", CASE, "-b", "torch", "--device", "cpu", "--no-timing", "--no-isolate",
                         "--out", out, *extra)  # fmt: skip
            assert res.exit_code == 2, res.output
            assert f"error: --out {out} is in use by another sweep (pid " in res.output, res.output
            assert not (out / "results.jsonl").exists() and "Traceback" not in res.output
    finally:
        held.close()
    res = invoke("sweep", "--case", CASE, "-b", "torch", "--device", "cpu", "--no-timing", "--no-isolate", "--out", out)
    assert res.exit_code == 0, res.output


def test_a_lock_left_by_a_killed_sweep_does_not_block(tmp_path):
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from attnbench.store.rundir import lock_run_dir; "
         f"f = lock_run_dir({str(out)!r}); print('locked', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        args = ["sweep", "--case", CASE, "-b", "torch", "--device", "cpu", "--no-timing", "--no-isolate", "--out", out]
        assert invoke(*args).exit_code == 2
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        res = invoke(*args)
        assert res.exit_code == 0, res.output
    finally:
        holder.kill()
        holder.wait(timeout=30)


# ---- merges of torn shards ------------------------------------------------------------------------------


def _shard(tmp_path: Path, k: int, n: int = 2) -> Path:
    rows = [synthetic.row(f"decode/b{k}-l{l}-h32x8-d128-bf16", "torch") for l in (1024, 2048, 4096)]
    run = {"schema_version": 2, "device": "cuda", "shard": {"k": k, "n": n}, "timing": True, "complete": True,
           "rows": 3, "wall_s": 1.0}  # fmt: skip
    return synthetic.write_run(tmp_path / f"s{k}", rows, run=run)


@pytest.mark.parametrize("what", list(TORN))
def test_a_merge_of_a_torn_shard_is_refused_or_incomplete_and_the_gate_fails_it(tmp_path, what):
    keep, message = TORN[what]
    s1, s2 = _shard(tmp_path, 1), _shard(tmp_path, 2)
    _keep_lines(s2, keep)
    res = invoke("merge", s1, s2, "--out", tmp_path / "all")
    assert res.exit_code == 2 and f"{s2}: results.jsonl {message}" in res.output and "--partial" in res.output
    assert not (tmp_path / "all").exists()
    res = invoke("merge", s1, s2, "--out", tmp_path / "all", "--partial")
    if what == "every row written twice":  # the same (case, backend) twice: refused as overlapping
        assert res.exit_code == 2 and "runs overlap" in res.output, res.output
        return
    assert "OK: nothing failing" not in res.output and "INCOMPLETE RUN" in res.output, res.output
    assert f"incomplete merge: {s2}: results.jsonl {message}" in res.output, res.output
    run = json.loads((tmp_path / "all" / "run.json").read_text())
    assert run["complete"] is False and message in run["stopped_by"]
    gate = invoke("gate", tmp_path / "all")
    assert gate.exit_code == 1 and message in gate.output, gate.output


def test_merge_partial_with_a_missing_shard_is_not_ok(tmp_path):
    s1 = _shard(tmp_path, 1)
    res = invoke("merge", s1, "--out", tmp_path / "all", "--partial")
    assert "OK: nothing failing" not in res.output and "INCOMPLETE RUN" in res.output, res.output
    assert "incomplete merge: shards 2/2 missing" in res.output
    assert invoke("gate", tmp_path / "all").exit_code == 1
    assert invoke("merge", s1, _shard(tmp_path, 2), "--out", tmp_path / "whole").exit_code == 0
    assert invoke("gate", tmp_path / "whole").exit_code == 0
