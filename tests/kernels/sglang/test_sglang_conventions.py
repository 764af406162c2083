"""The pure conversions to SGLang's conventions (kernels/sglang/conventions.py), on hand-worked cases.

No sglang needed: these run everywhere.
"""

from __future__ import annotations

import pytest
import torch

from attnbench.kernels.sglang import conventions as conv


def test_token_slots_follow_each_requests_pages():
    # request 0: pages [3, 1], 5 keys at page size 2 -> slots 6, 7, 2, 3, 4
    # request 1: pages [0], 2 keys -> slots 0, 1
    indptr = torch.tensor([0, 3, 4], dtype=torch.int32)
    pages = torch.tensor([3, 1, 2, 0], dtype=torch.int32)
    kv_indptr, kv_indices = conv.token_slots(indptr, pages, 2, [0, 0], [5, 2])
    assert kv_indptr.tolist() == [0, 5, 7]
    assert kv_indices.tolist() == [6, 7, 2, 3, 4, 0, 1]
    # SGLang's server dtypes: its kernels compute slot * row stride in the indices' dtype
    assert kv_indptr.dtype == torch.int32 and kv_indices.dtype == torch.int64


def test_token_slots_past_2_to_the_31_elements_stay_exact():
    """A slot of a production-size pool (2^21 pages of 16: 2^25 slots, 2^35 elements at 1024 a row)
    keeps its value, and slot * row stride does not wrap in the indices' dtype."""
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    pages = torch.tensor([2**21 - 1], dtype=torch.int32)
    _, kv_indices = conv.token_slots(indptr, pages, 16, [0], [16])
    assert kv_indices[-1].item() == 2**25 - 1
    assert (kv_indices * 1024)[-1].item() == (2**25 - 1) * 1024


def test_token_slots_of_a_key_range():
    # keys [3, 5) of pages [3, 1, 2] at page size 2: position 3 -> page 1 offset 1 = 3; 4 -> page 2 offset 0 = 4
    indptr = torch.tensor([0, 3], dtype=torch.int32)
    pages = torch.tensor([3, 1, 2], dtype=torch.int32)
    _, kv_indices = conv.token_slots(indptr, pages, 2, [3], [5])
    assert kv_indices.tolist() == [3, 4]


def test_token_slots_refuse_keys_beyond_the_pages():
    with pytest.raises(ValueError, match="do not fit"):
        conv.token_slots(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32), 2, [0], [3])


def test_token_view_is_a_view_of_the_paged_cache():
    cache = torch.arange(3 * 2 * 1 * 4, dtype=torch.float32).view(3, 2, 1, 4)
    flat = conv.token_view(cache)
    assert flat.shape == (6, 1, 4)
    assert torch.equal(flat[3], cache[1, 1])
    flat[5].fill_(-1)
    assert bool((cache[2, 1] == -1).all())
    mla_v = conv.token_view(cache[..., :2])  # the MLA value view of the same cache
    assert torch.equal(mla_v[3], cache[1, 1, :, :2])


def test_extend_prefix_range_starts_at_the_first_querys_window():
    assert conv.extend_prefix_range(30, -1) == (0, 30)
    assert conv.extend_prefix_range(30, 5) == (25, 30)  # the first query, at 30, sees keys 25..30
    assert conv.extend_prefix_range(3, 8) == (0, 3)
    assert conv.extend_prefix_range(0, 4) == (0, 0)


def test_decode_key_range_keeps_w_plus_one_keys():
    assert conv.decode_key_range(10, -1) == (0, 10)
    assert conv.decode_key_range(10, 3) == (6, 10)  # positions 6..9: the query at 9 and 3 before it
    assert conv.decode_key_range(10, 0) == (9, 10)
    assert conv.decode_key_range(3, 8) == (0, 3)


def test_sliding_window_size_is_w_and_zero_cannot_be_said():
    assert conv.sliding_window_size(-1) == -1
    assert conv.sliding_window_size(5) == 5  # keys j with i <= j + 5: [i - 5, i], as window_left 5
    with pytest.raises(ValueError, match="window 0"):
        conv.sliding_window_size(0)


def test_num_kv_splits_without_a_core_count_is_the_maximum():
    assert conv.num_kv_splits([5, 100], 32, 8, 8, 0) == [8, 8]


def test_num_kv_splits_worked_example():
    # 2 requests of 4096 and 1024 keys, 32 q heads over 8 kv heads, 132 SMs, max 8 splits:
    # spread: 4096 / 1024 = 4 chunks of 1024; device: 132 * log2(4096 / 64) = 792 programs over a
    # grid of 2 * ceil(32 / 4) = 16 -> min(50, 8) = 8 chunks of 512; splits = max(L/1024, L/512)
    assert conv.num_kv_splits([4096, 1024], 32, 8, 8, 132) == [8, 2]
    # lengths within 25% count as equal: spread gives one chunk; MHA grid 2 * 4 = 8, 132 programs
    # (log2(100/64) < 1) -> min(17, 8) = 8 chunks of 13 keys
    assert conv.num_kv_splits([100, 90], 4, 4, 8, 132)[0] == 8
    assert conv.num_kv_splits([100], 4, 4, 8, 132) == [8]
    # a big batch fills the device without splitting: grid 256 * 8 > 792 programs -> 1 chunk
    assert conv.num_kv_splits([4096] * 256, 32, 8, 8, 132) == [1] * 256


@pytest.mark.parametrize(
    "case_id, why",
    [
        ("extend/b2-q8-pre16-h4x2-d64-p16-kvshared-bf16", "k_extend"),
        ("extend/b2-q8-pre16-h4x2-d64-p16-swa0-bf16", "window 0"),
        ("decode/b2-l64-h4x2-d64-p16-fp8_e4m3-kvscalehead-bf16", "one k and one v scale per layer"),
        ("extend/b2-q8-pre16-h4x2-d64-p16-fp8_e4m3-kvscalehead-bf16", "one k and one v scale per layer"),
        ("tree_verify/b2-pre20-h4x2-d16-p4-treechain-depth4-fp8_e4m3-kvscalehead-fp16", "one k and one v scale"),
        ("gdn_extend/b2-t70-h1x2-d32x16-fp32", "float32"),
        ("gdn_decode/b2-h1x2-d512x64-bf16", "head_dim_k"),
    ],
)
def test_sglang_limits_name_what_its_kernels_cannot_say(case_id, why):
    from attnbench.backend import get_backend
    from attnbench.case import Case

    assert why in get_backend("sglang").limits(Case.from_id(case_id, "cuda"))


@pytest.mark.parametrize(
    "backend, case_id",
    [
        ("sglang", "decode/b2-l64-h4x2-d64-p16-fp8_e4m3-bf16"),
        ("sglang", "extend/b2-q8-pre16-h4x2-d64-p16-fp8_e4m3-bf16"),
        ("sglang", "extend/b2-q8-pre16-h4x2-d64-p16-kvattend-fp8_e5m2-bf16"),
        ("sglang", "tree_verify/b2-pre20-h4x2-d16-p4-treechain-depth4-fp8_e4m3-fp16"),
        ("sglang-unified", "extend/b2-q8-pre16-h4x2-d64-p16-custom-fp8_e4m3-bf16"),
    ],
)
def test_sglang_takes_a_per_tensor_fp8_cache(backend, case_id):
    """The layer's k/v scales are floats in every SGLang attention call (issue #36: extend, tree verify and the
    unified extend passed 1.0 and were skipped)."""
    from attnbench.backend import get_backend
    from attnbench.case import Case

    assert get_backend(backend).limits(Case.from_id(case_id, "cuda")) is None


def test_sglang_limits_let_the_rest_run():
    from attnbench.backend import get_backend
    from attnbench.case import Case

    for case_id in ("extend/b2-q8-pre16-h4x2-d64-p16-custom-bf16", "decode/b2-l64-h4x2-d64-p16-swa7-cap30-sink-bf16"):
        assert get_backend("sglang").limits(Case.from_id(case_id, "cuda")) is None


@pytest.mark.parametrize(
    "case_id, why",
    [
        ("gdn_decode/b8-h16x32-d128x128-fp16", "bf16"),
        ("gdn_decode/b8-h16x32-d64x128-bf16", "head_dim_k 128"),
        ("gdn_decode/b8-h16x32-d128x48-bf16", "multiple of 32"),
    ],
)
def test_sglang_cute_limits(case_id, why):
    from attnbench.backend import get_backend
    from attnbench.case import Case

    b = get_backend("sglang-cute")
    assert why in b.limits(Case.from_id(case_id, "cuda"))
    assert b.limits(Case.from_id("gdn_decode/b8-h16x32-d128x128-bf16", "cuda")) is None
    assert "CUDA" in b.limits(Case.from_id("gdn_decode/b8-h16x32-d128x128-bf16", "cpu"))
