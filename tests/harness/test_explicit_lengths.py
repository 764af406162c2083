"""Explicit per-request lengths (`kv_lens`, `q_lens`, `prefix_lens`): what replayed batches are made of."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from attnbench.buffers import storage_bytes
from attnbench.case import Case
from attnbench.ops.attention import DecodeParams, ExtendParams

SMALL = dict(heads_q=4, heads_kv=2, head_dim=16, page_size=4)


def test_decode_builds_exactly_the_lengths_given():
    p = DecodeParams(kv_lens=[5, 100, 37, 1], **SMALL)
    assert (p.batch, p.kv_len) == (4, 100)  # derived: ids and limits read them as before
    case = Case("decode", p, "bf16")
    x = case.make_inputs()
    assert x.seq_lens.tolist() == [5, 100, 37, 1]
    assert x.qo_indptr.tolist() == [0, 1, 2, 3, 4]
    assert case.op.input_bytes(p, case.torch_dtype, 0) == storage_bytes(x)


@pytest.mark.parametrize("new_kv", ["save", "attend", "shared"])
def test_extend_builds_exactly_the_lengths_given(new_kv):
    p = ExtendParams(q_lens=[1, 30, 1, 7], prefix_lens=[10, 0, 64, 3], new_kv=new_kv, **SMALL)
    assert (p.batch, p.q_len, p.prefix_len, p.keys) == (4, 30, 64, 65)
    case = Case("extend", p, "fp16")
    x = case.make_inputs()
    assert x.seq_lens.tolist() == [11, 30, 65, 10]
    assert x.qo_indptr.tolist() == [0, 1, 31, 32, 39]
    assert case.op.input_bytes(p, case.torch_dtype, 0) == storage_bytes(x)


def test_ids_name_explicit_lengths_by_digest():
    a = Case("decode", DecodeParams(kv_lens=[5, 100, 37], **SMALL))
    b = Case("decode", DecodeParams(kv_lens=[37, 100, 5], **SMALL))
    assert a.id.startswith("decode/b3-l100-lens") and a.id != b.id
    assert Case("decode", DecodeParams(kv_lens=[5, 100, 37], **SMALL)).id == a.id
    with pytest.raises(ValueError, match="no trace given .* holds this case; add the trace it came from: --trace FILE"):
        Case.from_id(a.id)
    # generated lengths keep their ids
    assert "lens" not in Case("decode", DecodeParams(batch=3, kv_len=100, lens="mixed", **SMALL)).id.split("-")[2]


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(kv_lens=[]), "empty"),
        (dict(kv_lens=[0, 3]), "integers >= 1"),
        (dict(kv_lens=[3], batch=2), "batch 2 contradicts kv_lens"),
        (dict(kv_lens=[3, 9], kv_len=4), "kv_len 4 contradicts"),
        (dict(kv_lens=[3, 4], lens="mixed"), "the lists replace lens"),
        (dict(kv_lens="12"), "list of per-request lengths"),
    ],
)
def test_decode_refuses_inconsistent_lengths(bad, message):
    with pytest.raises(ValidationError, match=message):
        DecodeParams(**bad)


def test_extend_refuses_inconsistent_lengths():
    with pytest.raises(ValidationError, match="differ in length"):
        ExtendParams(q_lens=[1, 2], prefix_lens=[1])
    with pytest.raises(ValidationError, match="needs q_lens"):
        ExtendParams(prefix_lens=[1])
    with pytest.raises(ValidationError, match="q_len 3 contradicts"):
        ExtendParams(q_lens=[1, 2], q_len=3)
    assert ExtendParams(q_lens=[4, 1]).prefix_lens == (0, 0)
