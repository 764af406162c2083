"""The chain suite's expectations (suites/expectations/chain.yaml) against the H100 chain run they were written
from (reports/examples/h100-session12/chain: 25 rows, 6 fail on two findings) and planted rows: the run ends
with 0 unexpected failures, while a listed row failing elsewhere, an unlisted chain row failing, a listed row
passing, or another library version still fails. Also the conv verify entry of findings.yaml: only its
pool write is covered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import synthetic
from attnbench.plan import expectations as ex
from attnbench.store.results import read_run_results

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "reports" / "examples" / "h100-session12" / "chain"
PREFIX = "gdn_chain/b8-h16x32-d128x128-t200-draft4-pad1-"
FI_VERIFY = (
    PREFIX + "kv-convert-extend@flashinfer-decode@flashinfer-verify@flashinfer-commit@triton-decode@flashinfer-bf16"
)
CUTE_RAW = PREFIX + "vk-raw-extend@flashinfer-decode@sglang.cute-verify@sglang-bf16"
TRITON_ONLY = PREFIX + "kv-convert-extend@triton-decode@triton-verify@triton-commit@triton-decode@triton-bf16"
FI_PARTS = ["inter_states@3", "o@3", "o@5", "state_pool", "state_pool@4", "state_pool@5"]  # as the H100 run
CUTE_PARTS = ["inter_states@3", "o@2", "o@3", "state_pool", "state_pool@2", "state_pool@3"]


def status(row) -> str:
    return getattr(row.status, "value", row.status)


def expectations(libraries: dict[str, str]):
    return ex.applicable(ex.builtin(), ex.versions_from_env({"libraries": libraries}))


@pytest.fixture(scope="module")
def h100_libraries() -> dict[str, str]:
    return json.loads((RUN / "env.json").read_text())["libraries"]


def test_the_h100_chain_run_has_no_unexpected_failure(h100_libraries):
    rows = read_run_results(RUN)
    before = [status(r) for r in rows]
    assert before.count("fail") == 6 and before.count("pass") == 19, before
    applied = ex.apply(rows, expectations(h100_libraries))
    assert [status(r) for r in applied].count("xfail") == 6 and [status(r) for r in applied].count("pass") == 19
    assert all("expectations/chain.yaml:" in r.expected["where"] for r in applied if status(r) == "xfail")


def planted(case_id: str, st: str, failed: list[str] | None = None):
    r = synthetic.row(case_id, "chain", status=st, median_us=None, params={})
    r.failed = sorted(failed or [])
    return r


@pytest.mark.parametrize(
    "case_id, st, failed, expect",
    [
        (FI_VERIFY, "fail", FI_PARTS, "xfail"),  # the finding as seen
        (FI_VERIFY, "fail", ["o@3", "inter_states@3"], "xfail"),  # fewer of its parts
        (FI_VERIFY, "fail", FI_PARTS + ["o@1"], "fail"),  # the extend before the verify broke too: new
        (FI_VERIFY, "fail", ["o@2"], "fail"),  # a decode failure, not the verify's NaN
        (FI_VERIFY, "pass", [], "xpass"),  # fixed: the expectation must go
        (CUTE_RAW, "fail", CUTE_PARTS, "xfail"),
        (CUTE_RAW, "fail", CUTE_PARTS + ["conv_states"], "fail"),  # the conv pool is not the layout finding
        (TRITON_ONLY, "fail", ["o@3"], "fail"),  # a chain no finding covers
        (TRITON_ONLY, "pass", [], "pass"),
    ],
)
def test_planted_chain_rows(h100_libraries, case_id, st, failed, expect):
    (row,) = ex.apply([planted(case_id, st, failed)], expectations(h100_libraries))
    assert status(row) == expect, row.reason


@pytest.mark.parametrize(
    "case_id, parts, moved",
    [
        (FI_VERIFY, FI_PARTS, {"flashinfer-python": "0.7.3"}),
        (CUTE_RAW, CUTE_PARTS, {"sglang": "0.5.11"}),
        (CUTE_RAW, CUTE_PARTS, {"nvidia-cutlass-dsl": "4.9.0"}),
    ],
)
def test_another_library_version_fails_again(h100_libraries, case_id, parts, moved):
    (row,) = ex.apply([planted(case_id, "fail", parts)], expectations(h100_libraries | moved))
    assert status(row) == "fail"


CONV_VERIFY = "causal_conv1d/b32-t4-c8192-verify-bf16"


@pytest.mark.parametrize(
    "failed, expect",
    [(["input conv_states was modified"], "xfail"), (["input conv_states was modified", "y"], "fail"), (["y"], "fail")],
)
def test_the_conv_verify_expectation_covers_the_pool_write_only(h100_libraries, failed, expect):
    """SGLang's conv verify writes the conv pool (findings.yaml; the H100 rows fail on that alone): a wrong y
    or window on those rows is not that finding."""
    r = synthetic.row(CONV_VERIFY, "sglang", status="fail", median_us=None, params={})
    r.failed = sorted(failed)
    (row,) = ex.apply([r], expectations(h100_libraries))
    assert status(row) == expect, row.reason
