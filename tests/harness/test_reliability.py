"""Faults do not stop a sweep: crashes, exits, hangs, OOM and raising plugins become error rows;
resume re-runs only what has no row; shards partition and merge back."""

from __future__ import annotations

import textwrap

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.plan.suite import load
from attnbench.store.results import read_results

runner = CliRunner()
CASE = "merge_state/t8-h2-d16-bf16"

FAULTY = textwrap.dedent("""
    import ctypes, os, time
    import torch
    import attnbench

    class _Merge(attnbench.Backend):
        def prepare_merge_state(self, case, x):
            def run():
                self.fault()
                return {"o": x.o, "lse": x.lse}
            return run

    @attnbench.register_backend("exits")
    class Exits(_Merge):
        def fault(self):
            os._exit(7)

    @attnbench.register_backend("segfaults")
    class Segfaults(_Merge):
        def fault(self):
            ctypes.string_at(0)

    @attnbench.register_backend("hangs")
    class Hangs(_Merge):
        def fault(self):
            time.sleep(600)

    @attnbench.register_backend("ooms")
    class Ooms(_Merge):
        def fault(self):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    @attnbench.register_backend("bad-supports")
    class BadSupports(_Merge):
        def supports(self, case):
            raise ValueError("boom")
""")


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_crashes_exits_hangs_and_ooms_become_error_rows_and_the_sweep_goes_on(tmp_path):
    plugin = tmp_path / "faulty.py"
    plugin.write_text(FAULTY)
    out = tmp_path / "run"
    backends = ["exits", "segfaults", "hangs", "ooms", "bad-supports", "torch"]
    args = ["sweep", "--case", CASE, "--case", "merge_state/t9-h2-d16-fp32", "--plugin", str(plugin), "--out", str(out),
            "--device", "cpu", "--no-timing", "--timeout", "20"]  # fmt: skip
    for b in backends:
        args += ["--backend", b]
    res = invoke(*args)
    assert res.exit_code == 1, res.output
    rows = read_results(out / "results.jsonl")
    assert len(rows) == 2 * len(backends)
    by = {(r.case_id.split("-")[0], r.backend): r for r in rows}
    for case in ("merge_state/t8", "merge_state/t9"):
        assert by[case, "torch"].status == "pass"
        assert by[case, "exits"].status == "error" and "exit code 7" in by[case, "exits"].reason
        assert by[case, "segfaults"].status == "error" and "SIGSEGV" in by[case, "segfaults"].reason
        assert by[case, "hangs"].status == "error" and "timed out after 20 s" in by[case, "hangs"].reason
        assert by[case, "ooms"].status == "error" and "out of memory" in by[case, "ooms"].reason
        assert "GiB" in by[case, "ooms"].reason  # the sizes involved
        assert (
            by[case, "bad-supports"].status == "error"
            and "supports() raised ValueError" in by[case, "bad-supports"].reason
        )
    assert (out / "report.html").is_file() and any((out / "logs").iterdir())


def test_in_process_mode_still_turns_exceptions_into_rows(tmp_path):
    plugin = tmp_path / "faulty.py"
    plugin.write_text(FAULTY)
    out = tmp_path / "run"
    res = invoke("sweep", "--case", CASE, "--plugin", str(plugin), "--backend", "ooms", "--backend", "torch",
                 "--out", str(out), "--device", "cpu", "--no-timing", "--no-isolate")  # fmt: skip
    assert res.exit_code == 1
    statuses = {r.backend: r.status for r in read_results(out / "results.jsonl")}
    assert statuses == {"ooms": "error", "torch": "pass"}


def test_resume_reruns_nothing_finished_and_everything_missing(tmp_path):
    out = tmp_path / "run"
    args = ["sweep", "smoke", "--op", "merge_state", "--backend", "torch", "--out", str(out), "--device", "cpu",
            "--no-timing", "--no-isolate"]  # fmt: skip
    assert invoke(*args).exit_code == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    n = len(lines)
    assert n == sum(c.op_name == "merge_state" for c in load("smoke").cases)
    (out / "results.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])  # crash mid-write
    res = invoke(*args, "--resume")
    assert res.exit_code == 0, res.output
    after = (out / "results.jsonl").read_text().splitlines()
    assert after[:2] == lines[:2]  # kept, not re-run
    rows = read_results(out / "results.jsonl")
    assert sorted(r.case_id for r in rows) == sorted(r.case_id for r in map(_row, lines))
    assert "resumed" in (out / "run.json").read_text()
    res = invoke(*args, "--resume")  # nothing left to do
    assert res.exit_code == 0 and len(read_results(out / "results.jsonl")) == n


def _row(line):
    import json

    from attnbench.store.results import Result

    return Result.from_dict(json.loads(line))


def test_shards_partition_the_cases_and_merge_back(tmp_path):
    base = ["sweep", "smoke", "--op", "merge_state", "--backend", "torch", "--device", "cpu", "--no-timing",
            "--no-isolate"]  # fmt: skip
    for k in (1, 2, 3):
        assert invoke(*base, "--shard", f"{k}/3", "--out", str(tmp_path / f"s{k}")).exit_code == 0
    ids = [{r.case_id for r in read_results(tmp_path / f"s{k}" / "results.jsonl")} for k in (1, 2, 3)]
    assert not (ids[0] & ids[1] or ids[1] & ids[2] or ids[0] & ids[2])
    res = invoke("merge", *(str(tmp_path / f"s{k}") for k in (1, 2, 3)), "--out", str(tmp_path / "all"))
    assert res.exit_code == 0, res.output
    merged = read_results(tmp_path / "all" / "results.jsonl")
    assert {r.case_id for r in merged} == ids[0] | ids[1] | ids[2]
    assert len(merged) == sum(c.op_name == "merge_state" for c in load("smoke").cases)
    assert (tmp_path / "all" / "report.html").is_file()
    res = invoke("merge", str(tmp_path / "s1"), str(tmp_path / "s1"), "--out", str(tmp_path / "dup"))
    assert res.exit_code == 2 and "overlap" in res.output


@pytest.mark.parametrize("bad", ["3/2", "0/2", "x"])
def test_bad_shard_is_a_usage_error(bad):
    res = invoke("sweep", "smoke", "--shard", bad, "--dry-run", "--device", "cpu")
    assert res.exit_code == 2 and "--shard" in res.output


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_sweep_with_a_report_of_what_finished(tmp_path, sig):
    """Also when the launching shell left SIGINT ignored (background jobs of scripts)."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnbench", "sweep", "smoke", "-b", "torch", "--device", "cpu", "--no-timing",
         "--out", str(out)],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    results = out / "results.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (results.exists() and len(results.read_text().splitlines()) >= 3):
        time.sleep(0.2)
    proc.send_signal(getattr(signal, sig))
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "interrupted: the report covers the cases that finished" in output
    rows = read_results(results)
    assert 3 <= len(rows) < len(load("smoke").cases)
    assert (out / "report.html").is_file() and (out / "junit.xml").is_file()


def test_out_of_memory_reason_keeps_sizes_not_allocator_advice():
    """An out-of-memory row names what was asked and what was free, without torch's advice paragraph."""
    from attnbench.errors import OUT_OF_MEMORY, describe

    msg = (
        "CUDA out of memory. Tried to allocate 2.25 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
        "524.31 MiB is free. Process 1038 has 25.72 GiB memory in use. Of the allocated memory 13.01 GiB is "
        "allocated by PyTorch. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
        "Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html)"
    )
    reason = describe(torch.OutOfMemoryError(msg))
    assert reason.startswith(OUT_OF_MEMORY + "CUDA out of memory. Tried to allocate 2.25 GiB.")
    assert "524.31 MiB is free" in reason and "Process 1038" in reason
    assert "expandable_segments" not in reason and "docs.pytorch.org" not in reason


def test_triton_out_of_memory_is_out_of_memory_and_other_runtime_errors_are_not():
    from attnbench.errors import OUT_OF_MEMORY, describe, out_of_memory

    triton_oom = RuntimeError("Triton Error [CUDA]: out of memory")
    assert out_of_memory(triton_oom) and describe(triton_oom).startswith(OUT_OF_MEMORY)
    assert not out_of_memory(RuntimeError("index out of range")) and not out_of_memory(ValueError("out of memory"))


class _TorchWith:
    """The torch backend under another name, its `prepare` replaced by `prepare(inner, case, inputs)`."""

    def __init__(self, name, prepare):
        from attnbench.backend import get_backend

        self.name, self.inner, self._prepare = name, get_backend("torch"), prepare

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def prepare(self, case, inputs):
        return self._prepare(self.inner, case, inputs)


def test_a_backend_that_keeps_device_memory_after_its_row_is_named(monkeypatch):
    """A backend whose row leaves tensors alive (a cache of its inputs) gets `kept_gib` in its
    prepare_info, so the out-of-memory error of a later backend has a named cause; one that frees
    everything gets nothing."""
    from attnbench.backend import get_backend
    from attnbench.buffers import all_tensors
    from attnbench.case import Case
    from attnbench.run import runner

    kept: list = []

    def leaky(inner, case, inputs):
        kept.append(inputs)  # a module-level cache of every input it was given
        return inner.prepare(case, inputs)

    def allocated():
        return sum(t.untyped_storage().nbytes() for x in kept for t in all_tensors(x)) * 2**20

    monkeypatch.setattr(runner, "_watch_kept", lambda case, opts, built: True)
    monkeypatch.setattr(runner, "_allocated", allocated)
    case = Case.from_id("decode/b2-l40-h4x2-d64-p16-bf16", "cpu")
    good, bad = runner.run_case(
        case, [get_backend("torch"), _TorchWith("leaky", leaky)], runner.RunOptions(timing=False)
    )
    assert good.status == "pass" and "kept_gib" not in (good.prepare_info or {})
    assert bad.status == "pass" and bad.prepare_info["kept_gib"] > 0, bad.prepare_info


def test_an_out_of_memory_row_says_what_the_case_holds():
    """An out-of-memory error names the case's own holdings (inputs, float64 expectation, twin, the
    checks' shared copies), so a suite whose cases cannot fit says which of them to cut."""
    from attnbench.case import Case
    from attnbench.run import runner

    def greedy(inner, case, inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.46 GiB.")

    case = Case.from_id("decode/b2-l40-h4x2-d64-p16-bf16", "cpu")
    row = runner.run_case(case, [_TorchWith("greedy", greedy)], runner.RunOptions(timing=False))[0]
    assert row.status == "error" and "Tried to allocate 16.46 GiB" in row.reason
    for held in ("case inputs", "float64 expectation", "twin", "cloned once per backend"):
        assert held in row.reason, row.reason
