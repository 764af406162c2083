"""A correct plugin backend for tests of the stale-output check: `eagle_build_tree` that builds its
mask in a tensor of its own and writes it into the preallocated output with `copy_`.

Load it with `attnbench sweep --plugin tests/support/copying_eagle.py -b copying-eagle`. It is the
torch backend's `eagle_build_tree`, except that the mask is computed into a fresh buffer sized from
the current `seq_lens` and then copied: a perturbation that changes `seq_lens` without the mask
buffer's size makes the `copy_` raise, where the torch backend (which indexes the buffer) did not.
"""

from __future__ import annotations

import dataclasses

import torch

import attnbench
from attnbench.kernels.torch.spec import build_eagle_tree


@attnbench.register_backend("copying-eagle")
class CopyingEagle(attnbench.Backend):
    def prepare_eagle_build_tree(self, case, x):
        def run():
            B, n = x.selected_index.shape[0], x.draft_tokens
            if x.mask_mode == "full":
                size = (int(x.seq_lens.sum()) * n + B * n * n,)
            else:
                size = tuple(x.tree_mask.shape)
            mask = torch.empty(size, dtype=x.tree_mask.dtype, device=x.tree_mask.device)
            out = build_eagle_tree(dataclasses.replace(x, tree_mask=mask))
            x.tree_mask.copy_(mask)
            return out | {"tree_mask": x.tree_mask}

        return run
