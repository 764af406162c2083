"""`TritonSpec`: the spec ops of the triton backend, as a mixin for its backend class.

tree_verify is the backend's custom-mask extend (its inputs are extend's `AttentionInputs`), so it
delegates to `prepare_extend`; eagle_build_tree and verify_greedy launch the kernels of `spec.py`.
Triton is imported when a kernel is prepared, so the backend package imports without it.
"""

from __future__ import annotations

from attnbench.backend import implements
from attnbench.kernels.triton.limits import attention_head_dims


class TritonSpec:
    """Mixin for the triton `Backend` (whose attention class has `prepare_extend`): tree_verify,
    eagle_build_tree and verify_greedy."""

    @implements("tree_verify", limits=attention_head_dims)
    def prepare_tree_verify(self, case, x):
        return self.prepare_extend(case, x)

    @implements("eagle_build_tree")
    def prepare_eagle_build_tree(self, case, x):
        from attnbench.kernels.triton.spec import build_eagle_tree

        return lambda: build_eagle_tree(x)

    @implements("verify_greedy")
    def prepare_verify_greedy(self, case, x):
        from attnbench.kernels.triton.spec import verify_greedy

        return lambda: verify_greedy(x)
