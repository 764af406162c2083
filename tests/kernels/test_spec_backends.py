"""Spec-family backends (torch, and triton under the interpreter) against the references on the smoke cases.

Integer outputs are compared bit for bit; tree verification passes the dtype-aware attention check.
Identities: a chain tree is a causal extend, the root alone is a decode. Broken kernels must fail.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from attnbench.backend import Backend, get_backend
from attnbench.buffers import clone_tensors
from attnbench.case import Case
from attnbench.ops.attention import AttentionInputs
from attnbench.plan.suite import load
from attnbench.references import attention as ref_attn
from helpers import SMOKE_KERNEL, run_one

SPEC_OPS = ("tree_verify", "eagle_build_tree", "verify_greedy")
interpreted = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="CPU cases run Triton in its interpreter (GPU runs: test_spec_gpu.py)",
)
SMOKE = [c for c in load("smoke").cases if c.op_name in SPEC_OPS]


def test_smoke_covers_every_spec_op():
    assert {c.op_name for c in SMOKE} == set(SPEC_OPS)


@pytest.mark.parametrize("case", SMOKE, ids=lambda c: c.id)
def test_case_ids_round_trip(case):
    assert Case.from_id(case.id) == case


@pytest.mark.parametrize("case", SMOKE, ids=lambda c: c.id)
def test_torch_passes(case):
    r = run_one(case, get_backend("torch"))
    assert r.status == "pass", r.reason


@pytest.mark.interpreter
@interpreted
@pytest.mark.parametrize("case", SMOKE, ids=lambda c: c.id)
def test_triton_passes(case):
    triton = get_backend("triton")
    r = run_one(case, triton, **SMOKE_KERNEL)
    if case.op_name == "tree_verify" and not hasattr(triton, "prepare_extend"):
        assert r.status == "skip" and "extend" in r.reason
        return
    assert r.status == "pass", r.reason


@pytest.mark.interpreter
@interpreted
@pytest.mark.parametrize("case", [c for c in SMOKE if c.op_name != "tree_verify"], ids=lambda c: c.id)
def test_integer_outputs_are_bit_exact(case):
    from attnbench.kernels.torch import spec as torch_spec
    from attnbench.kernels.triton import spec as triton_spec

    x = case.make_inputs()
    want = case.op.expected(case.params, x, torch.float64)
    name = "build_eagle_tree" if case.op_name == "eagle_build_tree" else "verify_greedy"
    for module in (torch_spec, triton_spec):
        got = getattr(module, name)(clone_tensors(x))
        for key, value in want.items():
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), (module.__name__, key)


# ---- identities --------------------------------------------------------------------------------------
@pytest.mark.parametrize("lens", ["equal", "mixed"])
def test_chain_tree_is_causal_extend(lens):
    tree = Case.from_id(f"tree_verify/b3-pre19-{lens}-h4x2-d64-p16-treechain-depth5-bf16")
    x = tree.make_inputs()
    # the same requests as a causal extend: the same build, the causal rule instead of the tree mask
    ext = dataclasses.replace(x, custom_mask=None, mask_indptr=None)
    ext = AttentionInputs(**{f.name: getattr(ext, f.name) for f in dataclasses.fields(AttentionInputs)})
    for b, (L, n) in enumerate(zip(x.seq_lens_host, x.q_lens_host, strict=True)):
        block = x.custom_mask[int(x.mask_indptr[b]) : int(x.mask_indptr[b + 1])].view(n, L)
        causal = torch.arange(L)[None, :] <= torch.arange(L - n, L)[:, None]
        assert torch.equal(block, causal)
    want_tree = tree.op.expected(tree.params, x, torch.float64)
    o, lse = ref_attn.paged_attention(
        ext.q, ext.k_cache, ext.v_cache, ext.kv_indptr, ext.kv_page_indices, ext.seq_lens, ext.qo_indptr,
        sm_scale=ext.sm_scale, k_new=ext.k_new, v_new=ext.v_new,
    )  # fmt: skip
    assert torch.equal(want_tree["o"], o) and torch.equal(want_tree["lse"], lse)
    torch_backend = get_backend("torch")
    got_tree = torch_backend.prepare_tree_verify(tree, clone_tensors(x))()
    got_ext = torch_backend.prepare_extend(tree, clone_tensors(ext))()
    assert torch.equal(got_tree["o"], got_ext["o"]) and torch.equal(got_tree["lse"], got_ext["lse"])


def test_chain_tree_case_is_the_extend_case():
    # with equal lengths the tree_verify and extend cases build the very same tensors
    tree = Case.from_id("tree_verify/b2-pre17-h4x2-d64-p16-treechain-depth3-bf16").make_inputs()
    ext = Case.from_id("extend/b2-q4-pre17-h4x2-d64-p16-bf16").make_inputs()
    for f in ("q", "k_cache", "v_cache", "k_new", "v_new", "kv_indptr", "kv_page_indices", "slot_mapping"):
        assert torch.equal(getattr(tree, f).nan_to_num(7.0), getattr(ext, f).nan_to_num(7.0)), f


def test_one_node_tree_is_decode():
    case = Case.from_id("tree_verify/b3-pre23-mixed-h8x2-d64-p16-treechain-depth0-bf16")
    x = case.make_inputs()
    assert x.q_lens_host == (1, 1, 1) and x.tree_mask.tolist() == [[[True]]] * 3
    # decode over the cache after the root's K/V are saved: one query per request, no new K/V, no mask
    saved_k = ref_attn.saved_cache(x.k_cache, x.k_new, x.slot_mapping)
    saved_v = ref_attn.saved_cache(x.v_cache, x.v_new, x.slot_mapping)
    dec = AttentionInputs(
        **{f.name: getattr(x, f.name) for f in dataclasses.fields(AttentionInputs)}
        | {"k_cache": saved_k, "v_cache": saved_v, "k_new": None, "v_new": None, "save_kv": False}
        | {"slot_mapping": None, "custom_mask": None, "mask_indptr": None}
    )
    want = case.op.expected(case.params, x, torch.float64)
    o, lse = ref_attn.paged_attention(
        dec.q, dec.k_cache, dec.v_cache, dec.kv_indptr, dec.kv_page_indices, dec.seq_lens, dec.qo_indptr,
        sm_scale=dec.sm_scale,
    )  # fmt: skip
    assert torch.equal(want["o"], o) and torch.equal(want["lse"], lse)
    torch_backend = get_backend("torch")
    got_tree = torch_backend.prepare_tree_verify(case, clone_tensors(x))()
    got_dec = torch_backend.prepare_decode(case, clone_tensors(dec))()
    assert torch.equal(got_tree["o"], got_dec["o"]) and torch.equal(got_tree["lse"], got_dec["lse"])


# ---- the checks catch broken kernels -------------------------------------------------------------------
class _Broken(Backend):
    name = "broken"


def test_tree_verify_ignoring_the_tree_mask_fails():
    from attnbench.kernels.torch.attention import paged_attention

    class CausalOnly(_Broken):
        def prepare_tree_verify(self, case, x):
            return lambda: paged_attention(dataclasses.replace(x, custom_mask=None, mask_indptr=None))

    r = run_one("tree_verify/b2-pre19-h4x2-d64-p16-treebinary-depth2-bf16", CausalOnly())
    assert r.status == "fail" and "o:" in r.reason


def test_build_tree_leaving_the_prefix_columns_fails():
    from attnbench.kernels.torch.spec import build_eagle_tree

    class DraftColumnsOnly(_Broken):  # writes the tree columns, leaves the prefix to its caller
        def prepare_eagle_build_tree(self, case, x):
            def run():
                before = x.tree_mask.clone()
                out = build_eagle_tree(x)
                n, lens = x.draft_tokens, x.seq_lens.tolist()
                start = 0
                for L in lens:
                    rows = x.tree_mask[start : start + n * (L + n)].view(n, L + n)
                    rows[:, :L] = before[start : start + n * (L + n)].view(n, L + n)[:, :L]
                    start += n * (L + n)
                return out

            return run

    r = run_one("eagle_build_tree/b2-pre30-k2-depth3-n6-maskfull-bf16", DraftColumnsOnly())
    assert r.status == "fail" and "tree_mask" in r.reason


def test_verify_without_the_bonus_token_fails():
    from attnbench.kernels.torch.spec import verify_greedy

    class NoBonus(_Broken):
        def prepare_verify_greedy(self, case, x):
            def run():
                before = x.predicts.clone()
                out = verify_greedy(x)
                rows = torch.arange(x.accept_index.shape[0])
                last = x.accept_index[rows, x.accept_length.long()].long()
                x.predicts[last] = before[last]
                return out

            return run

    r = run_one("verify_greedy/b4-treeeagle-depth3-k2-n6-bf16", NoBonus())
    assert r.status == "fail" and "predicts" in r.reason


# ---- parameters ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "case_id, why",
    [
        ("tree_verify/b1-pre8-h4x4-d64-p16-treeeagle-depth3-k2-bf16", "needs draft_tokens"),
        ("tree_verify/b1-pre8-h4x4-d64-p16-treebinary-depth3-k2-bf16", "topk applies"),
        ("eagle_build_tree/b1-pre8-k2-depth2-n8-maskfull-bf16", "at most 6 candidates"),
        ("eagle_build_tree/b1-pre8-k8-depth5-n64-maskqlen_packed-bf16", "at most 32"),
        ("verify_greedy/b1-tree0.1-depth2-bf16", "parent"),
    ],
)
def test_bad_parameters_are_explained(case_id, why):
    with pytest.raises(ValueError, match=why):
        Case.from_id(case_id)


def test_tree_verify_refuses_a_window():
    from attnbench.ops.spec import TreeVerifyParams

    with pytest.raises(ValueError, match="window"):
        TreeVerifyParams(window=4)


# ---- Triton kernels compile for a GPU (types the interpreter does not check) ---------------------------
_COMPILE = textwrap.dedent(
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from attnbench.kernels.triton import spec as S

    target = GPUTarget("cuda", 90, 32)
    names = ["p_parent_list", "p_selected", "p_seq_lens", "p_mask", "p_positions", "p_retrive_index",
             "p_next_token", "p_next_sibling", "B", "M", "topk", "depth"]
    types = ["*i64"] * 3 + ["*u8"] + ["*i64"] * 4 + ["i32"] * 4
    for mode, nbytes in ((0, 1), (1, 1), (2, 4)):
        consts = dict(N=64, BN=64, BB=16, BL=64, MASK_MODE=mode, NBYTES=nbytes)
        sig = dict(zip(names, types)) | {k: "constexpr" for k in consts}
        triton.compile(ASTSource(S._build_tree_kernel, sig, consts), target=target)
    names = ["p_candidates", "p_retrive_index", "p_next_token", "p_next_sibling", "p_target", "p_predicts",
             "p_accept_index", "p_accept_length", "N", "S"]
    sig = dict(zip(names, ["*i64"] * 5 + ["*i32"] * 3 + ["i32"] * 2)) | {"BS": "constexpr"}
    triton.compile(ASTSource(S._verify_greedy_kernel, sig, {"BS": 8}), target=target)
    print("compiled")
    """
)


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("triton.backends.nvidia") is None,
    reason="needs triton with its NVIDIA backend",
)
def test_triton_spec_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
