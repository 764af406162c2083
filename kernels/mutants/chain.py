"""Bugs only a chain of ops over one state pool shows (docs/chain.md): per op, each passes every check.

Each is a torch-backed GDN backend that declares a state layout; the mutant is the `chain` backend with
it run in place of `torch`, so a chain case whose steps name torch runs it.

- private pool: converts the pool into a private copy at `prepare` and writes the slots it changed back
  at `finalize`, the pattern every per-op adapter may follow (the per-op cases hold the pool: a backend
  may keep it in its own layout from `prepare` on). In a chain the pool changes between its `prepare`
  and its call (the steps before it write it), so it computes from the pool as it was.
- swapped layout: declares `vk` (`[N, HV, V, K]`, SGLang's Triton kernels' layout) but its kernel
  addresses the memory it is handed as `kv` (as SGLang's CuTe DSL decode reads `h0[pool, hv, k, v]`).
  Per op it is handed the canonical pool and is right; handed a `vk` pool, it reads every state
  transposed (K != V: scrambled).
"""

from __future__ import annotations

import dataclasses

from attnbench.backend import Backend, get_backend, implements

GDN_STATE_OPS = ("gdn_extend", "gdn_decode", "gdn_verify")


class _PrivatePool(Backend):
    name = "gdn-private-pool"

    @implements(*GDN_STATE_OPS, state_layout="kv")
    def prepare(self, case, x):
        private = x.state_pool.clone()  # "converted once" at prepare
        fn = get_backend("torch").prepare(case, dataclasses.replace(x, state_pool=private))
        idx = x.state_indices.long()
        slots = idx[idx >= 0]

        def run():
            return fn()

        def finalize(outputs):
            x.state_pool[slots] = private[slots]
            return outputs

        run.finalize = finalize
        return run


class _SwappedLayout(Backend):
    name = "gdn-swapped-layout"

    @implements(*GDN_STATE_OPS, state_layout="vk")
    def prepare(self, case, x):
        pool = x.state_pool
        if x.state_layout == "vk":  # the memory read as [N, HV, K, V], whatever was declared
            K, V = x.q.shape[-1], x.v.shape[-1]
            pool = pool.view(pool.shape[0], pool.shape[1], K, V)
        return get_backend("torch").prepare(case, dataclasses.replace(x, state_pool=pool, state_layout="kv"))


def chain_with(name: str, stand_in: Backend) -> Backend:
    """The `chain` backend running `stand_in` wherever a step names `torch`."""
    from attnbench.kernels.chain import ChainBackend

    b = ChainBackend()
    b.name, b.substitutes = name, {"torch": stand_in}
    return b


# (name, bug, the backend standing in for torch)
CHAIN_MUTANTS = (
    ("chain-private-pool", "GDN: works on a copy of the state pool taken at prepare, its slots written back after "
     "the call (right per op; stale once another step wrote the pool)", _PrivatePool),
    ("chain-swapped-layout", "GDN: declares the K-last pool layout [N, HV, V, K] but addresses the pool as "
     "[N, HV, K, V] (right per op on the canonical pool; wrong on a shared K-last pool)", _SwappedLayout),
)  # fmt: skip
