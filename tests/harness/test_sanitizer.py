"""Sanitize mode on CPU: log parsing, case sampling, refusal without a GPU, and attribution of
findings to rows through a stand-in compute-sanitizer (the real one runs in test_sanitizer_gpu.py)."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from dataclasses import replace

from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.plan.suite import load
from attnbench.run import sanitizer
from attnbench.run.runner import RunOptions
from attnbench.run.sweep import Execution, Selection, execute, plan, sample_per_op
from attnbench.store.results import read_results

MEMCHECK_LOG = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 2 bytes
=========     at _decode_split_kernel+0x1a30 in /tmp/kern.py:88
=========     by thread (37,0,0) in block (3,1,0)
=========     Address 0x7f3a2c010000 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3a2c000000 of size 65535 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2ef1b] in libcuda.so.1
=========
kernel print that is not a report
========= Invalid __global__ read of size 2 bytes
=========     at _decode_split_kernel+0x1a30 in /tmp/kern.py:88
=========     by thread (38,0,0) in block (3,1,0)
=========     Address 0x7f3a2c010002 is out of bounds
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamSynchronize.
========= ERROR SUMMARY: 2 errors
"""

RACECHECK_LOG = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at reduce_kernel(float *)+0x1f0 in reduce.cu:12
=========     and Read access at reduce_kernel(float *)+0x220 in reduce.cu:14 [1024 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


def test_parse_memcheck_reports():
    found = sanitizer.parse(MEMCHECK_LOG)
    assert len(found) == 2
    f = found[0]
    assert f.headline == "Invalid __global__ read of size 2 bytes"
    assert f.kernel == "_decode_split_kernel"
    assert (f.thread, f.block) == ("(37,0,0)", "(3,1,0)")
    assert f.address == "Address 0x7f3a2c010000 is out of bounds"
    assert "in _decode_split_kernel" in f.summary() and "thread (37,0,0) block (3,1,0)" in f.summary()


def test_parse_ignores_summaries_and_api_errors_and_clean_logs():
    assert sanitizer.parse("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n") == []
    assert sanitizer.parse("plain output\n") == []
    race = sanitizer.parse(RACECHECK_LOG)
    assert len(race) == 1 and race[0].headline.startswith("Error: Race reported between Write access")


def test_command_per_tool():
    cmd = sanitizer.command("memcheck", "/x/compute-sanitizer")
    assert cmd[:3] == ["/x/compute-sanitizer", "--tool", "memcheck"] and "--padding" in cmd
    assert "--padding" not in sanitizer.command("initcheck", "cs")


def test_sample_per_op_spreads_and_keeps_order():
    cases = load("smoke", "cpu").cases
    picked = sample_per_op(cases, 3)
    by_op: dict[str, list] = {}
    for c in cases:
        by_op.setdefault(c.op_name, []).append(c)
    for op, cs in by_op.items():
        mine = [c for c in picked if c.op_name == op]
        assert len(mine) == min(3, len(cs))
        assert mine[0] is cs[0] and mine[-1] is cs[-1]
    assert [cases.index(c) for c in picked] == sorted(cases.index(c) for c in picked)
    assert sample_per_op(cases, 0) == cases


def test_cli_refuses_without_a_gpu_or_with_a_bad_tool():
    r = CliRunner().invoke(app, ["sweep", "smoke", "--device", "cpu", "--sanitize", "memcheck"])
    assert r.exit_code == 2 and "needs a CUDA GPU" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["sweep", "smoke", "--device", "cpu", "--sanitize", "leakcheck"])
    assert r.exit_code == 2 and "memcheck, racecheck, initcheck, synccheck" in r.output


PLUGIN = textwrap.dedent("""
    import attnbench
    from attnbench.kernels.torch.merge import merge_state

    REPORT = (
        "========= Invalid __global__ read of size 4 bytes\\n"
        "=========     at leaky_merge_kernel+0x40\\n"
        "=========     by thread (1,0,0) in block (2,0,0)\\n"
        "=========     Address 0x7f0000001000 is out of bounds\\n"
        "========="
    )

    @attnbench.register_backend("tidy")
    class Tidy(attnbench.Backend):
        def prepare_merge_state(self, case, x):
            return lambda: merge_state(x)

    @attnbench.register_backend("leaky")
    class Leaky(attnbench.Backend):
        def prepare_merge_state(self, case, x):
            def run():
                print(REPORT, flush=True)  # what compute-sanitizer would print for this worker
                return merge_state(x)
            return run
""")

FAKE_SANITIZER = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, sys
    args = sys.argv[1:]
    start = args.index({sys.executable!r})
    print("fake-sanitizer", " ".join(args[:start]), "caching-off=" + os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", ""), flush=True)
    os.execv(args[start], args[start:])
""")


def test_findings_fail_their_own_row_through_a_stand_in_sanitizer(tmp_path):
    (tmp_path / "plug.py").write_text(PLUGIN)
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    from attnbench import backend as registry

    registry.load_plugin(str(tmp_path / "plug.py"))
    p = plan(Selection(("smoke",), "cpu", ("leaky", "tidy"), ops=("merge_state",)))
    p = replace(p, cases=p.cases[:2])
    out = tmp_path / "run"
    how = Execution(sanitize="memcheck", sanitizer=str(fake), plugins=(str(tmp_path / "plug.py"),))
    execute(p, out, RunOptions(timing=True), how=how)
    rows = {(r.case_id, r.backend): r for r in read_results(out / "results.jsonl")}
    assert len(rows) == 2 * 2
    for (_case, name), r in rows.items():
        assert r.timing is None, "sanitize mode never times"
        if name == "leaky":
            assert r.status == "fail", r.reason
            # the kernel ran a bounded number of times: checked call, determinism repeats, and per class of
            # inputs merge_state reads one stale-output re-run and its control (a freshly prepared closure)
            from attnbench.check.checks import DETERMINISM_REPEATS
            from attnbench.ops import OPS

            op = OPS["merge_state"]
            calls = 1 + DETERMINISM_REPEATS + 2 * len(op.perturbations(op.Params()))
            assert r.reason.startswith(f"memcheck: {calls} findings, first: Invalid __global__ read of size 4 bytes")
            assert "in leaky_merge_kernel" in r.reason and "block (2,0,0)" in r.reason and "logs/worker-" in r.reason
            assert r.sanitizer["findings"] == calls
        else:
            assert r.status == "pass", (name, r.reason)
            assert r.sanitizer == {"tool": "memcheck", "findings": 0, "log": r.sanitizer["log"]}
    logs = sorted(os.listdir(out / "logs"))
    assert len(logs) == 4, "one worker (and log) per case and backend"
    first = (out / "logs" / logs[0]).read_text()
    assert "--tool memcheck" in first and "caching-off=1" in first


def test_the_faulty_triton_plugin_kernel_is_correct_without_its_bug():
    """tests/support/faulty_triton.py (the memcheck test's plugin) computes decode right; only its reads are wrong."""
    from attnbench import backend as registry
    from attnbench.case import Case
    from helpers import run_one

    registry.load_plugin("tests/support/faulty_triton.py")
    row = run_one(Case.from_id(FAULTY_CASE, "cpu"), registry.get_backend("faulty-none"))
    assert row.status == "pass", row.reason


FAULTY_CASE = "decode/b3-l37-mixed-h8x2-d128-p1-bf16"
