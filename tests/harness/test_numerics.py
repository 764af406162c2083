"""Numerics beyond randn: distributions, fp8 KV caches, determinism and batch invariance."""

from __future__ import annotations

import math

import pytest
import torch

import attnbench
from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.kernels.torch.attention import prepare_paged_attention
from attnbench.ops.distributions import DISTRIBUTIONS
from attnbench.run.runner import RunOptions, run_case
from helpers import run_one


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_every_distribution_is_seeded_and_passes_torch(dist):
    cid = (
        f"decode/b3-l50-mixed-h8x2-d64-p16-{dist}-bf16" if dist != "normal" else "decode/b3-l50-mixed-h8x2-d64-p16-bf16"
    )
    a, b = Case.from_id(cid).make_inputs(), Case.from_id(cid).make_inputs()
    assert torch.equal(a.q, b.q) and torch.equal(a.k_cache.nan_to_num(), b.k_cache.nan_to_num())
    assert run_one(cid, get_backend("torch")).status == "pass"


def test_distributions_do_what_they_say():
    peaked = Case.from_id("decode/b2-l60-h4x4-d128-p16-peaked-bf16")
    x = peaked.make_inputs()
    ref = peaked.op.expected(peaked.params, x, torch.float64)
    assert ref["lse"].min() > 60  # the first key leads by ~80
    flat = Case.from_id("decode/b1-l30-h2x2-d16-p1-flat-fp32")
    x = flat.make_inputs()
    keys = x.k_cache[x.kv_page_indices.long()].flatten(0, 1)[:30]
    assert torch.equal(keys, keys[:1].expand_as(keys))
    big = Case.from_id("decode/b1-l30-h2x2-d128-p16-large_logits-fp32").make_inputs()
    s = big.q[0, 0].double() @ big.k_cache[big.kv_page_indices.long()].flatten(0, 1)[:30, 0].double().T
    assert s.abs().max() > 100  # raw scores in the hundreds


def test_fp8_cache_holds_scaled_values_and_the_reference_dequantises_them():
    case = Case.from_id("decode/b2-l40-h8x2-d64-p16-fp8_e4m3-kvscalehead-bf16")
    x = case.make_inputs()
    assert x.k_cache.dtype == torch.float8_e4m3fn and x.k_scale.shape == (2,)
    assert all(math.log2(s) == int(math.log2(s)) for s in x.k_scale.tolist())  # powers of two
    deq = x.k_cache.float() * x.k_scale.view(-1, 1)
    assert deq[torch.isfinite(deq)].abs().max() <= 448 * x.k_scale.max()


@pytest.mark.parametrize(
    "cid",
    [
        "decode/b2-l40-h8x2-d64-p16-fp8_e4m3-bf16",
        "extend/b2-q7-pre19-h4x2-d64-p16-fp8_e5m2-kvscalehead-bf16",
        "extend/b2-q6-pre10-h16x1-d576x512-p16-mla-fp8_e4m3-bf16",
        "extend/b2-q6-pre10-h4x2-d32-p16-kvattend-fp8_e4m3-fp16",
    ],
)
def test_torch_passes_fp8_caches(cid):
    row = run_one(cid, get_backend("torch"))
    assert row.status == "pass", row.reason


def test_ignoring_the_fp8_scale_is_caught():
    class NoScale(attnbench.Backend):
        name = "no-scale"

        def prepare_decode(self, case, x):
            import dataclasses

            return prepare_paged_attention(dataclasses.replace(x, k_scale=None, v_scale=None))

    row = run_one("decode/b2-l40-h8x2-d64-p16-fp8_e4m3-bf16", NoScale())
    assert row.status == "fail"


class _Noisy(attnbench.Backend):
    """Flips the last bit of one LSE on every other call (far inside the tolerance)."""

    name = "noisy"
    calls = 0

    def prepare_decode(self, case, x):
        run = prepare_paged_attention(x)

        def noisy():
            out = run()
            type(self).calls += 1
            x.lse.view(torch.int32)[0, 0] ^= type(self).calls % 2
            return out

        return noisy


class _BatchDependent(attnbench.Backend):
    """Its output depends on the batch size (a split count chosen from the batch, say)."""

    name = "batch-dependent"

    def prepare_decode(self, case, x):
        run = prepare_paged_attention(x)

        def dependent():
            out = run()
            x.lse.add_(1e-7 * len(x.seq_lens_host))
            return out

        return dependent


def test_determinism_and_batch_invariance_are_reported_and_can_be_required():
    # equal lengths: the torch backend pads a group of requests to its longest, so on mixed lengths a
    # request alone reduces over fewer keys than in its batch and its bits may differ (docs/findings.md)
    base = Case.from_id("decode/b3-l37-h8x2-d64-p16-bf16")
    for backend, det, inv in (
        (get_backend("torch"), True, True),
        (_Noisy(), False, None),
        (_BatchDependent(), True, False),
    ):
        (row,) = run_case(base, [backend], RunOptions(timing=False, invariance=True))
        assert row.deterministic == det, backend.name
        assert inv is None or row.batch_invariant == inv, backend.name  # a noisy kernel is neither
        assert row.status == "pass"  # reported, not required
    required = Case(base.op_name, base.params, base.dtype, require=frozenset({"deterministic", "batch_invariant"}))
    (row,) = run_case(required, [_Noisy()], RunOptions(timing=False))
    assert row.status == "fail" and "not deterministic" in row.reason
    (row,) = run_case(required, [_BatchDependent()], RunOptions(timing=False))
    assert row.status == "fail" and "not batch invariant" in row.reason
    (row,) = run_case(base, [get_backend("torch")], RunOptions(timing=False))
    assert row.batch_invariant is None  # not asked for


@pytest.mark.parametrize(
    "case_id",
    [
        "gdn_decode/b5-h2x4-d16x16-pad2-bf16",  # the state pool moves on each call
        "gdn_extend/b3-t70-mixed-h2x4-d16x16-initmixed-bf16",  # final states written back
        "causal_conv1d/b3-t9-mixed-c48-initmixed-bf16",  # conv states written back
        "extend/b2-q7-pre19-h4x2-d64-p16-bf16",  # new K/V saved into the cache (the same bits again)
    ],
)
def test_determinism_of_ops_that_write_their_inputs(case_id):
    """A call that updates its inputs is repeated from the pristine inputs, not from the updated ones."""
    (row,) = run_case(Case.from_id(case_id), [get_backend("torch")], RunOptions(timing=False))
    assert row.status == "pass", row.reason
    assert row.deterministic is True
