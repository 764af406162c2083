"""Check messages point at the real cause, and the harness raises no false alarm of its own."""

from __future__ import annotations

import math

import pytest
import torch

from attnbench.backend import Backend, get_backend
from attnbench.kernels.torch.attention import paged_attention
from helpers import run_one

EMPTY_ONLY = "extend/b1-q1-pre1-h1x1-d16-p16-custom-emptyrows-bf16"  # the only query sees no key


def _backend(name: str, run) -> Backend:
    def prepare(self, case, x):
        return lambda: run(x)

    return type(name, (Backend,), {"name": name, "prepare_decode": prepare, "prepare_extend": prepare})()


def test_no_stale_alarm_when_no_query_sees_a_key():
    row = run_one(EMPTY_ONLY, get_backend("torch"))
    assert row.status == "pass", row.reason


def test_stale_check_still_runs_where_outputs_can_change():
    """A kernel that computes once and then replays is stale on a case where some query sees a key."""
    memo = {}

    def replay(x):
        if not memo:
            paged_attention(x)
            memo.update(o=x.o.clone(), lse=x.lse.clone(), k=x.k_cache.clone(), v=x.v_cache.clone())
        for name, key in (("o", "o"), ("lse", "lse"), ("k_cache", "k"), ("v_cache", "v")):
            getattr(x, name).copy_(memo[key])
        return {"o": x.o, "lse": x.lse}

    row = run_one("extend/b2-q6-pre10-h4x2-d32-p16-custom-emptyrows-bf16", _backend("replay", replay))
    assert row.status == "fail" and row.reason.startswith("stale output: the queries (q) changed in place"), row.reason


def test_lse_minus_inf_is_reported_as_no_visible_key():
    def lost_rows(x):
        out = paged_attention(x)
        x.lse[0] = -math.inf  # as if token 0 saw no key
        return out

    row = run_one("decode/b3-l70-skewed-h8x2-d64-p16-sink-bf16", _backend("lost-rows", lost_rows))
    assert row.status == "fail"
    assert "-inf where the reference is finite" in row.reason and "no visible key" in row.reason, row.reason
    assert "poisoned" not in row.reason, row.reason


def test_nan_is_reported_as_unwritten_or_poisoned():
    def nan_rows(x):
        out = paged_attention(x)
        x.o[1, 0, 0] = math.nan
        return out

    row = run_one("decode/b3-l70-skewed-h8x2-d64-p16-bf16", _backend("nan-rows", nan_rows))
    assert "1 NaN where the reference is finite" in row.reason and "poisoned" in row.reason, row.reason


@pytest.mark.parametrize(
    ("returns", "words"),
    [
        (lambda x: None, "it returned NoneType"),
        (lambda x: {"out": x.o}, "it returned {'out'}: no 'o'; no 'lse'"),
        (lambda x: {"o": 1.0, "lse": x.lse}, "it returned {'o', 'lse'}: 'o' is float, not a tensor"),
    ],
)
def test_closure_contract_is_one_line(returns, words):
    def run(x):
        paged_attention(x)
        return returns(x)

    row = run_one("decode/b3-l70-skewed-h8x2-d64-p16-bf16", _backend("bad-return", run))
    assert row.status == "error"
    assert "must return a dict of the decode outputs {'o', 'lse'}" in row.reason and words in row.reason, row.reason
    assert "\n" not in row.reason and "Traceback" not in row.reason


@pytest.mark.parametrize(
    ("returns", "words"),
    [
        (
            lambda x: {"o": x.o[:-1], "lse": x.lse},
            "o: got (2, 8, 64) torch.bfloat16, expected (3, 8, 64) torch.bfloat16",
        ),
        (
            lambda x: {"o": x.o.double(), "lse": x.lse},
            "o: got (3, 8, 64) torch.float64, expected (3, 8, 64) torch.bfloat16",
        ),
        (lambda x: {"o": torch.empty_like(x.o, device="meta"), "lse": x.lse}, "torch.bfloat16 on meta, expected"),
    ],
)
def test_an_output_of_the_wrong_shape_dtype_or_device_fails_saying_so(returns, words):
    """A wrong layout is a failed check with what was returned and what was expected, not an error
    raised by a later check that compares the values."""

    def run(x):
        paged_attention(x)
        return returns(x)

    row = run_one("decode/b3-l70-skewed-h8x2-d64-p16-bf16", _backend("bad-layout", run))
    assert row.status == "fail" and words in row.reason, row.reason


@pytest.mark.parametrize("exc", [SystemExit(3), BaseException("boom")])
def test_a_backend_raising_a_base_exception_is_an_error_row_not_the_end_of_the_sweep(exc):
    """A library that calls sys.exit (or raises a bare BaseException) ends its row, in-process too."""

    def run(x):
        raise exc

    row = run_one("decode/b3-l70-skewed-h8x2-d64-p16-bf16", _backend("exits", run))
    assert row.status == "error" and type(exc).__name__ in row.reason, row.reason


def test_ctrl_c_inside_a_backend_still_stops_the_sweep():
    def run(x):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_one("decode/b3-l70-skewed-h8x2-d64-p16-bf16", _backend("interrupted", run))
