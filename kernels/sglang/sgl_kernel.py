"""sgl-kernel's CUDA EAGLE kernels behind the canonical spec contracts: the `sgl-kernel` backend.

- eagle_build_tree: `sgl_kernel.build_tree_kernel_efficient(parent_list, selected_index, seq_lens,
  tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
  draft_token_num, tree_mask_mode)`. As SGLang's wrapper (`eagle_utils.build_tree_kernel_efficient`)
  does before it, the closure fills the mask (True; 0 when bit-packed) and the retrieve links (-1):
  the kernel writes only what differs. Mask modes: full 0, qlen 1, qlen_packed 2 (rows packed in
  uint8/16/32 for n <= 8/16/32: attnbench's `[B n, nbytes]` uint8 rows viewed as those words,
  little-endian, no copy).
- verify_greedy: `sgl_kernel.verify_tree_greedy(predicts, accept_index, accept_token_num, candidates,
  retrive_index, retrive_next_token, retrive_next_sibling, target_predict)`, the same tensors.

Where it runs: sgl-kernel 0.3.21 (the version on PyPI beside sglang 0.5.10.post1) is a 535 MB wheel
built for torch 2.9.1; SGLang 0.5.10 has no Triton version of these kernels (its eagle_utils calls
sgl_kernel on CUDA and sgl_kernel_npu on NPUs), so there is no separate Triton variant to offer.
"""

from __future__ import annotations

import functools
import importlib

import torch

MASK_MODES = {"full": 0, "qlen": 1, "qlen_packed": 2}
PACKED_WORDS = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32}


@functools.cache
def missing() -> str | None:
    try:
        importlib.import_module("sgl_kernel")
    except Exception as e:
        return (
            f"sgl_kernel does not import ({type(e).__name__}: {e}); sgl-kernel 0.3.21 is a 535 MB wheel "
            "built for torch 2.9.1: install it where torch is 2.9.1 (pip install --no-deps sgl-kernel==0.3.21)"
        )
    return None


def sgl_mask(tree_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """attnbench's tree-mask buffer as sgl-kernel takes it: the bool masks as they are; the packed
    `[B n, nbytes]` uint8 rows as one little-endian word per row `[B n]` (uint8/16/32), a view."""
    if mode != "qlen_packed":
        return tree_mask
    words = tree_mask.view(PACKED_WORDS[tree_mask.shape[1]])
    return words.view(-1)


def prepare_build_tree(case, x):
    sk = importlib.import_module("sgl_kernel")
    mask = sgl_mask(x.tree_mask, x.mask_mode)
    fill = 0 if x.mask_mode == "qlen_packed" else True
    mode = MASK_MODES[x.mask_mode]

    def run():
        mask.fill_(fill)
        for t in (x.retrive_index, x.retrive_next_token, x.retrive_next_sibling):
            t.fill_(-1)
        sk.build_tree_kernel_efficient(
            x.parent_list, x.selected_index, x.seq_lens, mask, x.positions, x.retrive_index,
            x.retrive_next_token, x.retrive_next_sibling, x.topk, x.depth, x.draft_tokens, mode,
        )  # fmt: skip
        return {
            "tree_mask": x.tree_mask, "positions": x.positions, "retrive_index": x.retrive_index,
            "retrive_next_token": x.retrive_next_token, "retrive_next_sibling": x.retrive_next_sibling,
        }  # fmt: skip

    run.info = {"variant": "sgl_kernel.build_tree_kernel_efficient (+ the wrapper's buffer fills)"}
    return run


def prepare_verify_greedy(case, x):
    sk = importlib.import_module("sgl_kernel")

    def run():
        sk.verify_tree_greedy(
            x.predicts, x.accept_index, x.accept_length, x.candidates, x.retrive_index, x.retrive_next_token,
            x.retrive_next_sibling, x.target_predict,
        )  # fmt: skip
        return {"predicts": x.predicts, "accept_index": x.accept_index, "accept_length": x.accept_length}

    run.info = {"variant": "sgl_kernel.verify_tree_greedy"}
    return run
