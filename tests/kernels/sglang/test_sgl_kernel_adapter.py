"""The sgl-kernel adapter (kernels/sglang/sgl_kernel.py) on a CPU, against a stand-in for sgl_kernel.

The stand-in writes what sgl-kernel's CUDA kernels write by their documented contract (from the
float64 reference): in a full mask only the draft columns (the prefix stays as SGLang's wrapper
filled it), bit-packed rows as one uint8/16/32 word each, retrieve links only where a child or
sibling exists. So these tests check the adapter's buffer fills, mask views and argument order
through the harness; the real kernels need the sgl-kernel wheel (torch 2.9.1).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attnbench.backend import Backend, implements
from attnbench.kernels.sglang import sgl_kernel as adapter
from attnbench.references import spec as ref
from helpers import run_one

MODES = {0: "full", 1: "qlen", 2: "qlen_packed"}


def _build(parent_list, selected_index, seq_lens, tree_mask, positions, retrive_index, retrive_next_token,
           retrive_next_sibling, topk, depth, n, mode):  # fmt: skip
    t = ref.build_eagle_tree(parent_list, selected_index, seq_lens, topk, depth, n, MODES[mode])
    if MODES[mode] == "full":
        at = 0
        for L in seq_lens.tolist():
            block = t.tree_mask[at : at + n * (L + n)].view(n, L + n)
            tree_mask[at : at + n * (L + n)].view(n, L + n)[:, L:] = block[:, L:]  # the draft columns only
            at += n * (L + n)
    elif MODES[mode] == "qlen":
        tree_mask.copy_(t.tree_mask)
    else:
        word = tree_mask.dtype
        assert tree_mask.dim() == 1 and word == {1: torch.uint8, 2: torch.uint16, 4: torch.uint32}[t.tree_mask.shape[1]]
        tree_mask |= t.tree_mask.contiguous().view(word).view(-1)
    positions.copy_(t.positions)
    retrive_index.copy_(t.retrive_index)
    for dst, src in ((retrive_next_token, t.retrive_next_token), (retrive_next_sibling, t.retrive_next_sibling)):
        dst[src >= 0] = src[src >= 0]


def _verify(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
            retrive_next_sibling, target_predict):  # fmt: skip
    v = ref.verify_tree_greedy(candidates, retrive_index, retrive_next_token, retrive_next_sibling, target_predict,
                               num_spec_steps=accept_index.shape[1], predicts=predicts.clone())  # fmt: skip
    predicts.copy_(v.predicts)
    accept_index.copy_(v.accept_index)
    accept_token_num.copy_(v.accept_length)


@pytest.fixture
def fake_sgl_kernel(monkeypatch):
    mod = types.ModuleType("sgl_kernel")
    mod.build_tree_kernel_efficient, mod.verify_tree_greedy = _build, _verify
    monkeypatch.setitem(sys.modules, "sgl_kernel", mod)


class _Adapter(Backend):
    name = "sgl-kernel-adapter-test"

    @implements("eagle_build_tree")
    def prepare_eagle_build_tree(self, case, x):
        return adapter.prepare_build_tree(case, x)

    @implements("verify_greedy")
    def prepare_verify_greedy(self, case, x):
        return adapter.prepare_verify_greedy(case, x)


CASES = [
    "eagle_build_tree/b3-pre40-mixed-k4-depth4-n16-maskfull-bf16",
    "eagle_build_tree/b3-pre40-mixed-k2-depth3-n6-maskqlen-bf16",
    "eagle_build_tree/b3-pre40-mixed-k1-depth5-n6-maskqlen_packed-bf16",
    "eagle_build_tree/b3-pre40-mixed-k4-depth4-n16-maskqlen_packed-bf16",
    "eagle_build_tree/b2-pre9-k4-depth5-n20-maskqlen_packed-bf16",
    "verify_greedy/b4-treeeagle-depth3-k2-n6-bf16",
    "verify_greedy/b4-treeeagle-depth5-k4-n32-bf16",
]


@pytest.mark.parametrize("case_id", CASES)
def test_sgl_kernel_adapter_conventions(case_id, fake_sgl_kernel):
    r = run_one(case_id, _Adapter())
    assert r.status == "pass", f"{r.status}: {r.reason}"


def test_packed_rows_are_little_endian_words():
    rows = torch.tensor([[0x01, 0x02], [0xFF, 0x00]], dtype=torch.uint8)
    words = adapter.sgl_mask(rows, "qlen_packed")
    assert words.dtype == torch.uint16 and words.tolist() == [0x0201, 0x00FF]
    words[1] = 0x0300
    assert rows[1].tolist() == [0x00, 0x03]  # a view: the kernel's writes land in attnbench's buffer
