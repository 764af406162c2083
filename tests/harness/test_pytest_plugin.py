"""The pytest plugin (`pytest --attnbench SUITE`) under pytester: verdicts, skips, benchmark JSON, xdist."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnbench import backend as backend_mod
from attnbench.cli.pytest_plugin import worker_device

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _restore_registry():
    """In-process pytester runs import the conftest below: drop the backends it registers afterwards."""
    before = dict(backend_mod._REGISTRY)
    yield
    for name in set(backend_mod._REGISTRY) - set(before):
        backend_mod._REGISTRY.pop(name)
        backend_mod._INSTANCES.pop(name, None)


# A conftest that registers two plugin backends: one that computes zeros (fails every check) and one
# that only supports merge_state (skips the rest).
CONFTEST = """
import torch
import attnbench
from attnbench.kernels.torch import TorchBackend

@attnbench.register_backend("zeros")
class Zeros(TorchBackend):
    def prepare_merge_state(self, case, x):
        inner = super().prepare_merge_state(case, x)
        def run():
            out = inner()
            out["o"].zero_()
            return out
        return run

@attnbench.register_backend("mergeonly")
class MergeOnly(TorchBackend):
    def supports(self, case):
        return None if case.op_name == "merge_state" else "mergeonly has only merge_state"
"""


@pytest.mark.parametrize(
    "requested, worker, n, expected",
    [
        ("auto", None, 0, "cpu"),
        ("auto", "gw3", 0, "cpu"),
        ("auto", None, 1, "cuda"),
        ("auto", "gw1", 1, "cuda"),  # one GPU: every worker shares it
        ("auto", "gw1", 4, "cuda:1"),
        ("cuda", "gw5", 4, "cuda:1"),  # more workers than GPUs: wrap around
        ("cuda:2", "gw0", 4, "cuda:2"),  # an explicit device wins
        ("cpu", "gw1", 4, "cpu"),
    ],
)
def test_worker_device(requested, worker, n, expected):
    assert worker_device(requested, worker, n) == expected


def test_suite_rows_become_tests(pytester):
    pytester.makeconftest(CONFTEST)
    backends = [a for b in ("torch", "mergeonly", "zeros") for a in ("--attnbench-backend", b)]
    result = pytester.runpytest(
        "--attnbench", "smoke", *backends, "-k", "merge_state", "-p", "no:cacheprovider", "-rfs"
    )
    # n merge_state cases x (torch pass, mergeonly pass, zeros fail); the other ops are deselected by -k
    outcomes = result.parseoutcomes()
    n = _merge_cases()
    assert outcomes.get("failed") == n and outcomes.get("passed") == 2 * n, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*merge_state/t33-h4-d64-fp32*zeros*", "*o: *abs error*", "*re-run alone: attnbench sweep*"]
    )


def test_skip_rows_are_pytest_skips(pytester):
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest(
        "--attnbench",
        "smoke",
        "--attnbench-backend",
        "mergeonly",
        "-k",
        "b2-l45-h4x2-d64",
        "-p",
        "no:cacheprovider",
        "-rs",
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*mergeonly has only merge_state*"])


def test_bad_suite_is_a_usage_error(pytester):
    result = pytester.runpytest("--attnbench", "no-such-suite", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*attnbench*no-such-suite*"])


def _check_benchmark_json(path, n):
    doc = json.loads(path.read_text())
    assert len(doc["benchmarks"]) == n
    for b in doc["benchmarks"]:
        s = b["stats"]
        assert s["min"] <= s["median"] <= s["max"] and s["rounds"] >= 3 and s["iterations"] == 1
        assert b["extra_info"]["clock"] == "host" and b["params"]["backend"] == "torch"
    assert doc["machine_info"]["attnbench"]["device"] == "cpu"
    # pytest-benchmark's own CLI reads it
    cmp = subprocess.run(
        [sys.executable, "-m", "pytest_benchmark", "compare", str(path), "--group-by", "group"],
        capture_output=True,
        text=True,
    )
    assert cmp.returncode == 0, cmp.stderr
    assert "merge_state/t33-h4-d64-fp32[torch]" in cmp.stdout and "Median" in cmp.stdout
    return doc


def test_benchmark_json_for_pytest_benchmark(pytester):
    out = pytester.path / "bench.json"
    result = pytester.runpytest(
        "--attnbench",
        "smoke",
        "--attnbench-backend",
        "torch",
        "-k",
        "merge_state",
        "--attnbench-benchmark-json",
        str(out),
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=_merge_cases())
    _check_benchmark_json(out, _merge_cases())


def test_under_xdist(pytester):
    out = pytester.path / "bench.json"
    result = pytester.runpytest_subprocess(
        "--attnbench",
        "smoke",
        "--attnbench-backend",
        "torch",
        "-k",
        "merge_state",
        "--attnbench-benchmark-json",
        str(out),
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=_merge_cases())
    result.stdout.fnmatch_lines(["*2 workers*"])
    doc = _check_benchmark_json(out, _merge_cases())
    assert len({b["fullname"] for b in doc["benchmarks"]}) == _merge_cases()


def _merge_cases() -> int:
    from attnbench.plan.suite import load

    return sum(c.op_name == "merge_state" for c in load("smoke").cases)
