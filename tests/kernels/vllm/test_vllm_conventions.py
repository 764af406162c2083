"""The conversions to vLLM's conventions (kernels/vllm/attention.py) and the vllm backend's limits,
on hand-worked cases. No vllm needed (its kernels run on CUDA only: docs/deployed.md)."""

from __future__ import annotations

import pytest
import torch

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.kernels.vllm import attention as conv


def test_window_size_keeps_w_plus_one_keys():
    # vLLM keeps key k for the query at q when q - k < 1 + window_size[0]: k in [q - W, q] for (W, 0)
    assert conv.window_size(5) == (5, 0)
    assert conv.window_size(0) == (0, 0)  # only the query's own key
    assert conv.window_size(-1) == (-1, -1)


def test_block_table_is_the_csr_table_padded_with_page_zero():
    indptr = torch.tensor([0, 3, 4, 6], dtype=torch.int32)
    pages = torch.tensor([5, 2, 7, 1, 3, 4], dtype=torch.int32)
    table = conv.block_table(indptr, pages)
    assert table.dtype == torch.int32
    assert table.tolist() == [[5, 2, 7], [1, 0, 0], [3, 4, 0]]


@pytest.mark.parametrize(
    "case_id, why",
    [
        ("extend/b2-q8-pre16-h4x2-d64-p16-custom-bf16", "custom mask"),
        ("extend/b2-q8-pre16-h4x2-d64-p16-kvattend-bf16", "from the cache"),
        ("decode/b2-l64-h4x2-d64-p16-fp8_e5m2-bf16", "read as e4m3"),
        ("decode/b2-l64-h4x2-d64-p16-fp8_e4m3-kvscalehead-bf16", "per-head scales cannot be expressed"),
        ("decode/b2-l64-h4x2-d64x32-p16-bf16", "one head size"),
    ],
)
def test_vllm_limits_name_what_unified_attention_cannot_say(case_id, why):
    assert why in get_backend("vllm").limits(Case.from_id(case_id, "cuda"))


def test_vllm_limits_let_the_rest_run_and_cpu_cases_skip(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # without the interpreter, CPU cases are skips
    b = get_backend("vllm")
    for case_id in (
        "extend/b2-q8-pre16-h4x2-d64-p16-swa7-cap30-sink-kvshared-bf16",
        "decode/b2-l64-h4x2-d64-p16-bf16",
        "decode/b2-l64-h4x2-d64-p16-fp8_e4m3-bf16",
    ):
        assert b.limits(Case.from_id(case_id, "cuda")) is None
    assert "CUDA only" in b.limits(Case.from_id("decode/b2-l64-h4x2-d64-p16-bf16", "cpu"))


def test_tree_bias_is_zero_where_visible_and_refuses_different_trees():
    chain = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    bias = conv.tree_bias(torch.stack([chain, chain]))
    assert bias.dtype == torch.float32
    assert bias[2].tolist() == [0.0, 0.0, 0.0] and bias[0, 1] == float("-inf")
    fork = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    with pytest.raises(ValueError, match="trees differ"):
        conv.tree_bias(torch.stack([chain, fork]))


def test_split_k_scratch_is_what_vllms_backend_passes():
    """vLLM's Triton backend hands unified_attention a 128 // Hkv threshold, 16 segments and fp32 scratch
    with one row per query token (padded head dim); queries over 8 tokens never split: no scratch."""
    from attnbench.kernels.vllm.attention import split_k_scratch

    s = split_k_scratch(tokens=12, max_q=3, heads_q=32, heads_kv=8, head_dim=96, device="cpu")
    assert s["seq_threshold_3D"] == 16 and s["num_par_softmax_segments"] == 16
    assert s["softmax_segm_output"].shape == (12, 32, 16, 128) and s["softmax_segm_output"].dtype == torch.float32
    assert s["softmax_segm_max"].shape == s["softmax_segm_expsum"].shape == (12, 32, 16)
    assert (
        split_k_scratch(tokens=4, max_q=1, heads_q=8, heads_kv=1, head_dim=128, device="cpu")["seq_threshold_3D"] == 128
    )
    assert split_k_scratch(tokens=900, max_q=9, heads_q=32, heads_kv=8, head_dim=128, device="cpu") == {}
