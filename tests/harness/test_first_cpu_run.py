"""The first run on a CPU machine: correctness only by default (timing on request), and one line per
backend that ran nothing, saying why (no CUDA GPU, library not installed, the Triton interpreter)."""

from __future__ import annotations

from typer.testing import CliRunner

import synthetic
from attnbench.cli.app import app
from attnbench.report.skips import skipped_backends
from attnbench.store.results import read_results

CASE = "merge_state/t9-h2-d16-fp32"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_a_cpu_sweep_checks_correctness_only_unless_timing_is_asked(tmp_path):
    res = invoke("sweep", "--case", CASE, "-b", "torch", "--device", "cpu", "--no-isolate", "--out", tmp_path / "a")
    assert res.exit_code == 0, res.output
    assert "correctness only on cpu (no GPU)" in res.output and "--timing" in res.output
    assert [r.timing for r in read_results(tmp_path / "a" / "results.jsonl")] == [None]
    res = invoke("sweep", "--case", CASE, "-b", "torch", "--device", "cpu", "--no-isolate", "--timing",
                 "--out", tmp_path / "b")  # fmt: skip
    assert res.exit_code == 0 and "correctness only" not in res.output, res.output
    (row,) = read_results(tmp_path / "b" / "results.jsonl")
    assert row.timing["clock"] == "host" and row.timing["median_us"] > 0


def test_each_backend_that_ran_nothing_gets_one_line_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    res = invoke("sweep", "--case", CASE, "--case", "merge_state/t17-h2-d32-fp32", "--device", "cpu", "--no-isolate",
                 "--out", tmp_path / "run")  # fmt: skip
    assert res.exit_code == 0, res.output
    block = res.output[res.output.index("that ran nothing:") :].splitlines()[1:]
    block = [line for line in block if line.startswith("  ")]
    names = [line.split()[0] for line in block]
    assert len(names) == len(set(names)) and "torch" not in names  # one line per backend, not per row
    line = {line.split()[0]: line for line in block}
    assert "TRITON_INTERPRET=1" in line["triton"] and "no CUDA device" in line["triton"]
    assert "not installed" in line["flashinfer"]
    assert "no merge_state kernel" in line["fla"]


def test_the_backends_own_unavailability_is_the_reason_it_skipped():
    """A backend not installed also lacks kernels for some ops: the line names the thing to fix."""
    rows = [synthetic.row("merge_state/t9-h2-d16-fp32", "lib", "skip", reason="lib has no merge_state kernel")]
    rows += [synthetic.row(f"decode/b{b}-l64", "lib", "skip", reason="lib is not installed") for b in (1, 2)]
    rows += [synthetic.row("decode/b1-l64", "torch", "pass"), synthetic.row("decode/b2-l64", "torch", "skip")]

    class Lib:
        def available(self):
            return "lib is not installed"

    (s,) = skipped_backends(rows, {"lib": Lib()})
    assert (s.backend, s.rows) == ("lib", 3)
    assert s.reason == "lib is not installed (+1 other reason: see the report)"
    (s,) = skipped_backends(rows, {})  # a backend not loaded here: its rows' most common reason
    assert s.reason.startswith("lib is not installed")
