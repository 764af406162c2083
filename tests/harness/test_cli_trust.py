"""Verdicts a user can trust (issue #17): the gate has no holes, nothing is lost, bad input is one line."""

from __future__ import annotations

import os

from typer.testing import CliRunner

import synthetic
from attnbench.cli.app import app
from attnbench.report.compare import GateRule, compare_pair, compare_runs

runner = CliRunner()
CASES = [f"decode/b{b}-l1024-h32x8-d128-bf16" for b in (1, 8, 64)]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _run(path, rows):
    return synthetic.write_run(path, rows)


def _timed(cid, backend="triton", us=20.0, **kw):
    return synthetic.row(cid, backend, timing=synthetic.timing(us, seed=hash(cid) % 97, **kw))


# ---- the regression gate has no holes -------------------------------------------------------------


def test_compare_with_no_rows_in_common_fails_the_gate(tmp_path):
    base = _run(tmp_path / "a", [_timed(CASES[0], "triton")])
    new = _run(tmp_path / "b", [_timed(CASES[0], "flashinfer")])
    res = invoke("compare", base, new, "--allow-missing")
    assert res.exit_code == 1, res.output
    assert "no rows in common" in res.output and "Traceback" not in res.output


def test_compare_where_every_common_row_is_not_comparable_fails_the_gate(tmp_path):
    base = _run(tmp_path / "a", [_timed(c) for c in CASES])
    graph = [synthetic.row(c, "triton", timing=synthetic.timing(20.0, mode="cuda-graph")) for c in CASES]
    new = _run(tmp_path / "b", graph)
    res = invoke("compare", base, new)
    assert res.exit_code == 1, res.output
    assert "none of the 3 common rows can be compared" in res.output and "cuda-graph" in res.output


def test_timed_against_untimed_is_not_comparable():
    c = compare_pair(_timed(CASES[0]), synthetic.row(CASES[0], "triton", median_us=None), GateRule())
    assert c.verdict == "not comparable" and "timed in base only" in c.note


def test_rows_timed_on_different_gpus_are_not_comparable():
    b = _timed(CASES[0])
    n = _timed(CASES[0])
    n.env = {"device": "cuda", "gpu": "NVIDIA H200"}
    b.env = {"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}
    n.timing = synthetic.timing(40.0)  # twice as slow, but on another GPU: no verdict on speed
    c = compare_pair(b, n, GateRule())
    assert c.verdict == "not comparable" and "H200" in c.note and not c.regression


def test_missing_and_newly_skipped_rows_fail_the_gate_unless_allowed(tmp_path):
    base = _run(tmp_path / "a", [_timed(c) for c in CASES])
    new_rows = [_timed(CASES[0]), synthetic.row(CASES[1], "triton", status="skip", median_us=None)]
    new = _run(tmp_path / "b", new_rows)
    cmp = compare_runs(base, new)
    assert sorted(c.verdict for c in cmp.regressions) == ["missing", "now skipped"]
    assert invoke("compare", base, new).exit_code == 1
    res = invoke("compare", base, new, "--allow-missing")
    assert res.exit_code == 0, res.output
    assert not compare_runs(base, new, GateRule(allow_missing=True)).regressions


def test_compare_refuses_a_negative_threshold(tmp_path):
    rows = [_timed(c) for c in CASES]
    base, new = _run(tmp_path / "a", rows), _run(tmp_path / "b", rows)
    res = invoke("compare", base, new, "--min-change", "-0.1")
    assert res.exit_code == 2 and "--min-change" in res.output and "Traceback" not in res.output


def test_identical_runs_still_pass_the_gate(tmp_path):
    rows = [_timed(c) for c in CASES]
    base, new = _run(tmp_path / "a", rows), _run(tmp_path / "b", rows)
    res = invoke("compare", base, new)
    assert res.exit_code == 0, res.output


# ---- bad input: exit 2 and one line, never a traceback or an exhausted machine ---------------------

MERGE = ("--op", "merge_state", "--backend", "torch", "--device", "cpu", "--no-timing", "--no-isolate")
ONE_CASE = ("--case", "merge_state/t9-h2-d16-fp32", "--backend", "torch", "--device", "cpu", "--no-timing",
            "--no-isolate")  # fmt: skip


def _one_line_error(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    for w in words:
        assert w in lines[0], res.output


def test_out_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("keep me")
    _one_line_error(invoke("sweep", *ONE_CASE, "--out", f), "is a file")
    _one_line_error(invoke("sweep", *ONE_CASE, "--out", f / "sub"), "is a file")
    assert f.read_text() == "keep me"


def test_out_that_cannot_be_written_is_refused(tmp_path):
    import os

    if os.geteuid() == 0:  # root writes through permissions: use a place no one may create in
        target = "/sys/attnbench-run"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "run"
    _one_line_error(invoke("sweep", *ONE_CASE, "--out", target), "cannot write")


def test_timeout_must_be_positive(tmp_path):
    for t in ("0", "-5"):
        _one_line_error(invoke("sweep", *ONE_CASE, "--timeout", t, "--out", tmp_path / "o"), "--timeout")
    assert not (tmp_path / "o").exists()


def test_non_utf8_suite_names_file_and_line(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"cases:\n  - op: merge_state\n    # caf\xe9\n")
    _one_line_error(invoke("sweep", bad, "--dry-run", "--device", "cpu"), f"{bad}:3:", "UTF-8")


def test_yaml_alias_bomb_is_refused_quickly(tmp_path):
    import time

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\ncases:\n  - op: merge_state\n    params: {}\n")
    assert bomb.stat().st_size < 1024
    t0 = time.perf_counter()
    res = invoke("sweep", bomb, "--dry-run", "--device", "cpu")
    assert time.perf_counter() - t0 < 10
    _one_line_error(res, f"{bomb}:", "aliases expand")


def test_recursive_alias_is_refused(tmp_path):
    rec = tmp_path / "rec.yaml"
    rec.write_text("x: &x [1, *x]\ncases:\n  - op: merge_state\n")
    _one_line_error(invoke("sweep", rec, "--dry-run", "--device", "cpu"), f"{rec}:1:", "own anchor")


def test_small_aliases_still_work(tmp_path):
    ok = tmp_path / "ok.yaml"
    ok.write_text(
        "cases:\n  - op: merge_state\n    sweep: &ax {tokens: [3, 5]}\n  - op: merge_state\n    sweep: *ax\n"
        "    dtypes: [fp32]\n"
    )
    res = invoke("sweep", ok, "--dry-run", "--device", "cpu")
    assert res.exit_code == 0 and "4 cases" in res.output, res.output


def test_huge_cartesian_product_is_refused_before_expanding(tmp_path):
    import time

    huge = tmp_path / "huge.yaml"
    huge.write_text("cases:\n  - op: merge_state\n    sweep:\n      tokens: {range: [1, 100000]}\n"
                    "      heads: {range: [1, 100000]}\n")  # fmt: skip
    t0 = time.perf_counter()
    res = invoke("sweep", huge, "--dry-run", "--device", "cpu")
    assert time.perf_counter() - t0 < 10
    _one_line_error(res, f"{huge}:", "--max-cases")
    small = tmp_path / "small.yaml"
    small.write_text("cases:\n  - op: merge_state\n    sweep:\n      tokens: {range: [1, 30]}\n"
                     "      heads: {range: [1, 4]}\n")  # fmt: skip
    _one_line_error(invoke("sweep", small, "--dry-run", "--device", "cpu", "--max-cases", "100"), "120 cases")
    res = invoke("sweep", small, "--dry-run", "--device", "cpu", "--max-cases", "200")
    assert res.exit_code == 0 and "120 cases" in res.output, res.output


# ---- nothing lost: --out with results, --resume of another plan -----------------------------------


def test_out_with_results_is_refused_without_resume_or_overwrite(tmp_path):
    out = tmp_path / "run"
    assert invoke("sweep", *ONE_CASE, "--out", out).exit_code == 0
    before = (out / "results.jsonl").read_bytes()
    _one_line_error(invoke("sweep", *ONE_CASE, "--out", out), "already holds a run", "--overwrite")
    assert (out / "results.jsonl").read_bytes() == before
    _one_line_error(invoke("sweep", *ONE_CASE, "--out", out, "--resume", "--overwrite"), "choose one")
    res = invoke("sweep", *ONE_CASE, "--out", out, "--overwrite")
    assert res.exit_code == 0, res.output
    assert len((out / "results.jsonl").read_text().splitlines()) == 1


def test_resume_refuses_another_plan_and_says_what_differs(tmp_path):
    out = tmp_path / "run"
    assert invoke("sweep", "smoke", *MERGE, "-k", "t17", "--out", out).exit_code == 0
    before = (out / "results.jsonl").read_bytes()
    res = invoke("sweep", "smoke", *MERGE, "-k", "t33", "--out", out, "--resume")
    _one_line_error(res, "another plan", "filter k: ['t17'] -> ['t33']")
    res = invoke("sweep", "smoke", *MERGE, "-k", "t17", "--out", out, "--resume", "--timing")
    _one_line_error(res, "timing: False -> True")
    assert (out / "results.jsonl").read_bytes() == before
    assert invoke("sweep", "smoke", *MERGE, "-k", "t17", "--out", out, "--resume").exit_code == 0


# ---- output in CI logs -------------------------------------------------------------------------------


def test_not_on_a_terminal_progress_is_plain_lines_and_paths_stay_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_PROGRESS_S", "0.05")
    out = tmp_path / ("a-rather-long-directory-name-for-a-ci-run-" * 3) / "run"
    res = invoke("sweep", "smoke", *MERGE, "--out", out)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    progress = [line for line in lines if line.startswith("progress: rows ")]
    from attnbench.plan.suite import load

    n = sum(c.op_name == "merge_state" for c in load("smoke").cases)  # smoke is generated: count, don't pin
    assert progress and progress[-1].startswith(f"progress: rows {n}/{n} (100%), pass {n}, fail 0, error 0, skip 0")
    assert "ETA" in progress[0]
    assert f"report: {out / 'report.html'}" in lines  # one line, whole, parseable
    assert not any(("━" in line and f"{n}/{n}" in line) or "\r" in line for line in lines)  # no live bar


def test_plain_progress_lines_come_at_a_steady_rate():
    import io
    import time

    from rich.console import Console

    from attnbench.cli.progress import SweepProgress

    buf = io.StringIO()
    with SweepProgress(Console(file=buf, width=200), total=10, every_s=0.05) as prog:
        time.sleep(0.3)  # a long case: lines keep coming while nothing finishes
        prog.rows("x", [synthetic.row(CASES[0], "torch", status="fail")])
    text = buf.getvalue()
    assert text.count("progress: rows 0/10") >= 3
    assert "progress: rows 1/10 (10%), pass 0, fail 1" in text and "fail decode/" in text


def test_list_backends_through_a_pipe_is_one_line_per_backend_and_op():
    from attnbench.backend import all_backends

    res = invoke("list", "backends", "--device", "cpu")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    expected = sum(len(b.ops) for b in all_backends().values())
    assert len(lines) == expected + 2  # a title and a header
    assert any(line.split()[:3] == ["torch", "decode", line.split()[2]] and "supported" in line for line in lines)


# ---- the pytest plugin ----------------------------------------------------------------------------

CRASHER = """
import os
import attnbench
from attnbench.kernels.torch import TorchBackend

@attnbench.register_backend("crasher")
class Crasher(TorchBackend):
    def prepare_merge_state(self, case, x):
        if "t33-h4-d64-fp32" in case.id:
            os._exit(3)  # takes its process down
        return super().prepare_merge_state(case, x)
"""


def _pytest(tmp_path, *args):
    import subprocess
    import sys

    # a fresh pytest: not a worker of the xdist session running this test (its PYTEST_XDIST_* variables)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *map(str, args)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip


def _smoke_merge_cases() -> int:
    """merge_state cases in smoke (generated: counted, not pinned)."""
    from attnbench.plan.suite import load

    return sum(c.op_name == "merge_state" for c in load("smoke").cases)


def test_pytest_plugin_a_backend_that_kills_its_process_is_a_failed_test(tmp_path):
    plugin = tmp_path / "crasher.py"
    plugin.write_text(CRASHER)
    (tmp_path / "test_own.py").write_text("def test_own_project_test():\n    raise AssertionError('collected')\n")
    res = _pytest(tmp_path, "--attnbench", "smoke", "--attnbench-backend", "crasher", "--attnbench-plugin", plugin,
                  "-k", "merge_state", "-rf")  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    n = _smoke_merge_cases()
    assert f"1 failed, {n - 1} passed" in out, (
        out
    )  # the crash fails its test; the rest run; test_own.py is not collected
    assert "exit code 3" in out and "test_own_project_test" not in out
    assert f"--plugin {plugin}" in out  # the re-run hint brings the plugin along


def test_pytest_plugin_with_test_paths_still_collects_them(tmp_path):
    (tmp_path / "test_own.py").write_text("def test_own_project_test():\n    pass\n")
    res = _pytest(tmp_path, "test_own.py", "--attnbench", "smoke", "--attnbench-backend", "torch", "-k",
                  "own or merge_state/t33-h4-d64-fp32")  # fmt: skip
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout + res.stderr


# ---- console labels -------------------------------------------------------------------------------


def test_a_named_backend_that_cannot_run_says_why_once_on_the_console(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = ["sweep", "smoke", "--op", "merge_state", "-b", "triton", "-b", "torch", "--device", "cpu", "--no-timing",
            "--no-isolate", "--out", tmp_path / "run"]  # fmt: skip
    res = invoke(*args)
    assert res.exit_code == 1, res.output  # a backend named with -b that ran nothing fails the run
    n = _smoke_merge_cases()
    lines = [
        line for line in res.output.splitlines() if line.startswith(f"error: triton (named with -b) skipped all {n}")
    ]
    assert len(lines) == 1 and "TRITON_INTERPRET=1" in lines[0], res.output
    res = invoke(*args, "--overwrite", "--allow-skipped")
    assert res.exit_code == 0, res.output
    notes = [
        line for line in res.output.splitlines() if line.startswith(f"note: triton (named with -b) skipped all {n}")
    ]
    assert len(notes) == 1 and "TRITON_INTERPRET=1" in notes[0], res.output


def test_host_clock_timings_are_labelled_on_the_console(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    res = invoke("sweep", "--case", "merge_state/t9-h2-d16-fp32", "-b", "torch", "--device", "cpu", "--no-isolate",
                 "--timing", "--out", tmp_path / "run")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "note: 1 rows were timed with a host clock (CPU): not GPU timings" in res.output
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    res = invoke("sweep", "--case", "merge_state/t9-h2-d16-fp32", "-b", "torch", "--device", "cpu", "--no-isolate",
                 "--timing", "--out", tmp_path / "run", "--overwrite")  # fmt: skip
    assert "note: 1 rows were timed with a host clock under TRITON_INTERPRET=1" in res.output


def test_console_summary_md_and_junit_count_the_same(tmp_path):
    import re

    out = tmp_path / "run"
    plugin = tmp_path / "half.py"
    plugin.write_text(
        "import attnbench\nfrom attnbench.kernels.torch import TorchBackend\n\n"
        "@attnbench.register_backend('half')\nclass Half(TorchBackend):\n"
        "    def prepare_merge_state(self, case, x):\n"
        "        inner = super().prepare_merge_state(case, x)\n"
        "        if 't17' not in case.id:\n            return inner\n"
        "        def run():\n            out = inner()\n            out['o'].mul_(2)\n            return out\n"
        "        return run\n"
    )
    res = invoke("sweep", "smoke", "--op", "merge_state", "-b", "half", "-b", "torch", "--plugin", plugin,
                 "--device", "cpu", "--no-timing", "--out", out)  # fmt: skip
    assert res.exit_code == 1, res.output
    line = next(line for line in res.output.splitlines() if line.split()[:1] == ["half"])
    console = [int(x) for x in line.split()[1:] if x.isdigit()]
    junit = (out / "junit.xml").read_text()
    failures = int(re.search(r'<testsuites[^>]* failures="(\d+)"', junit).group(1))
    from attnbench.plan.suite import load

    n = sum(c.op_name == "merge_state" and "t17" in c.id for c in load("smoke").cases)  # the rows 'half' breaks
    assert failures == sum(console[i] for i in (1, 3)) == n  # fail + xpass columns (pass fail xfail xpass ...)
    assert f"{n} fail" in (out / "summary.md").read_text()


def test_dry_run_lists_every_case_id(tmp_path):
    from attnbench.plan.suite import load

    res = invoke("sweep", "smoke", "--op", "merge_state", "--dry-run", "--device", "cpu")
    assert res.exit_code == 0, res.output
    ids = [c.id for c in load("smoke").cases if c.op_name == "merge_state"]
    listed = [line.split()[0] for line in res.output.splitlines() if line.startswith("  merge_state/")]
    assert listed == ids


def test_dry_run_sizes_each_case_and_flags_what_cannot_fit(monkeypatch):
    """Each case line carries its input size and least peak; a case over the device's free memory is
    flagged, with a count at the end (sizes from `Op.input_bytes`, tests/harness/test_input_bytes.py)."""
    import attnbench.run.footprint as fp

    small, big = "decode/b2-l33-h4x2-d64-p16-bf16", "decode/b64-l65536-h32x8-d128-p16-bf16"
    monkeypatch.setattr(fp, "available", lambda device: (8 * 2**30, "test device"))
    res = invoke("sweep", "--case", small, "--case", big, "-b", "torch", "--dry-run", "--device", "cpu")
    assert res.exit_code == 0, res.output
    lines = {line.split()[0]: line for line in res.output.splitlines() if line.startswith("  decode/")}
    assert "69.1 KiB inputs, >= 138.2 KiB with the 1 backend(s)" in lines[small] and "NOT FIT" not in lines[small]
    assert "18.0 GiB inputs" in lines[big] and "DOES NOT FIT (8.0 GiB free on test device)" in lines[big]
    assert "1 of 2 cases do not fit" in res.output
