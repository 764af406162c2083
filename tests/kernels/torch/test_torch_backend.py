"""The bundled PyTorch backend against the float64 references, over a property-based sweep."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.ops.attention import DecodeParams, ExtendParams, MergeStateParams
from helpers import run_one

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
dtypes = st.sampled_from(["fp32", "fp16", "bf16"])


@st.composite
def heads(draw):
    kv = draw(st.sampled_from([1, 2, 4]))
    return kv * draw(st.sampled_from([1, 2, 3])), kv


@st.composite
def common(draw):
    hq, hkv = draw(heads())
    d = draw(st.sampled_from([8, 13, 32, 64]))
    dv = draw(st.sampled_from([None, None, 16]))
    return dict(
        heads_q=hq,
        heads_kv=hkv,
        head_dim=d,
        head_dim_v=dv,
        page_size=draw(st.sampled_from([1, 3, 16, 64])),
        window=draw(st.sampled_from([-1, -1, 0, 5, 30])),
        soft_cap=draw(st.sampled_from([0.0, 0.0, 2.0, 30.0])),
        sinks=draw(st.booleans()),
    )


def assert_pass(case: Case) -> None:
    row = run_one(case, get_backend("torch"))
    assert row.status == "pass", f"{case.id}: {row.reason}"


@SETTINGS
@given(c=common(), batch=st.integers(1, 4), kv_len=st.integers(1, 90), lens=st.sampled_from(["equal", "mixed", "skewed"]),
       dtype=dtypes, seed=st.integers(0, 3))  # fmt: skip
def test_decode_matches_reference(c, batch, kv_len, lens, dtype, seed):
    assert_pass(Case("decode", DecodeParams(batch=batch, kv_len=kv_len, lens=lens, **c), dtype, seed))


@SETTINGS
@given(c=common(), batch=st.integers(1, 3), q_len=st.integers(1, 12), prefix=st.integers(0, 40),
       lens=st.sampled_from(["equal", "mixed"]), mask=st.sampled_from(["causal", "bidirectional", "custom"]),
       new_kv=st.sampled_from(["save", "attend", "shared"]), dtype=dtypes)  # fmt: skip
def test_extend_matches_reference(c, batch, q_len, prefix, lens, mask, new_kv, dtype):
    p = ExtendParams(batch=batch, q_len=q_len, prefix_len=prefix, lens=lens, mask=mask, new_kv=new_kv, **c)
    assert_pass(Case("extend", p, dtype))


@SETTINGS
@given(
    tokens=st.integers(1, 40),
    heads=st.integers(1, 5),
    d=st.sampled_from([1, 16, 80]),
    empty=st.booleans(),
    dtype=dtypes,
)
def test_merge_state_matches_reference(tokens, heads, d, empty, dtype):
    assert_pass(Case("merge_state", MergeStateParams(tokens=tokens, heads=heads, head_dim=d, empty=empty), dtype))


def test_mla_decode_and_extend():
    assert_pass(Case.from_id("decode/b3-l70-mixed-h16x1-d576x512-p16-mla-bf16"))
    assert_pass(Case.from_id("extend/b2-q9-pre33-mixed-h8x1-d576x512-p1-mla-swa6-sink-bf16"))


def test_long_sequences_are_chunked_without_changing_results(monkeypatch):
    import attnbench.kernels.torch.attention as impl

    monkeypatch.setattr(impl, "_budget", lambda device: 2048)  # forces one request per group, row chunks
    assert_pass(Case.from_id("extend/b3-q40-pre50-mixed-h4x2-d16-p16-custom-swa20-bf16"))
    assert_pass(Case.from_id("decode/b5-l200-mixed-h4x1-d16-p16-bf16"))


@pytest.mark.parametrize("seed", range(12))
def test_merge_state_floor_follows_cancelling_summands(seed):
    """d=1 makes a (token, head) slice one element: where v_a e^{s_a} and v_b e^{s_b} cancel, |o| is far
    below the summands that float32 rounds at; the floor scales with them (OutputSpec.magnitude)."""
    assert_pass(Case("merge_state", MergeStateParams(tokens=40, heads=3, head_dim=1), "fp32", seed))


def test_serving_mix_batches_one_long_chunk_decodes_and_short_chunks():
    """`lens: serving` is a chunked-prefill scheduler's extend batch: request 0 a long prefill chunk,
    then decodes (q 1) and short chunks (q_len / 8) in turn, over mixed prefixes."""
    case = Case.from_id("extend/b7-q64-pre300-serving-h4x2-d16-p16-bf16")
    kv, q = case.op.request_lengths(case.params, case.seed)
    prefix = [k - n for k, n in zip(kv, q)]  # mixed prefixes: the longest (300) at a seeded position
    assert q == [64, 1, 8, 1, 1, 8, 1] and max(prefix) == 300 and len(set(kv)) > 3
    assert "serving-mix" in case.op.features(case.params)
    assert_pass(case)
    assert_pass(Case.from_id("extend/b5-q40-pre50-serving-h4x1-d32-p1-custom-swa20-sink-fp16"))
