"""`TritonSpec`: the spec ops of the triton backend, as a mixin for its backend class.

tree_verify is the backend's custom-mask extend (its inputs are extend's `AttentionInputs`), so it
delegates to `prepare_extend`; eagle_build_tree and verify_greedy launch the kernels of `spec.py`.
Triton is imported when a kernel is prepared, so the backend package imports without it.
"""

from __future__ import annotations

from attnbench.errors import Unsupported


class TritonSpec:
    """Mixin for the triton `Backend`: tree_verify, eagle_build_tree and verify_greedy."""

    def prepare_tree_verify(self, case, x):
        extend = getattr(self, "prepare_extend", None)
        if extend is None:
            raise Unsupported("this triton build has no extend kernel to verify trees with")
        return extend(case, x)

    def prepare_eagle_build_tree(self, case, x):
        from attnbench.kernels.triton.spec import build_eagle_tree

        return lambda: build_eagle_tree(x)

    def prepare_verify_greedy(self, case, x):
        from attnbench.kernels.triton.spec import verify_greedy

        return lambda: verify_greedy(x)
