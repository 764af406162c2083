"""The `chain` backend: runs a `gdn_chain` case, each step by the backend the case names, on one pool.

The pool lives in the case's layout (`kv` `[N, HV, K, V]` or `vk` `[N, HV, V, K]`, fp32) for the whole
chain, with one scratch slot at its end that no request uses (the slot a K-last extend clears instead
of a request that keeps its state, kernels/native_states.py `zero_fresh_states_`). Each step's
backend declares the layout its kernel addresses the pool in (`implements(state_layout=...)`); a step
whose implementation declares none cannot join a chain (its limits say so). Per step:

- declared layout == the pool's: the step gets the pool itself (`inputs.state_layout` set), no copy;
- otherwise, `handoff: convert`: the chain copies the pool into a buffer of the step's layout before the
  step and back after it (recorded in the row's `prepare_info["steps"]`);
- otherwise, `handoff: raw`: the step gets the pool's memory as it is, viewed in its declared layout
  (what a server that hands one `ssm_states` tensor to kernels of two layouts does).

Every step is prepared once, before the chain runs (as a server prepares its kernels), then the closure
runs them in order, each followed by its `finalize`, and copies the pool after each step into that
step's `state_pool@i` (canonical). The pool enters the chain's layout from the case's canonical
`state_pool` at the start of the call and leaves it at the end: the copies in and out of the harness are
the only conversions besides the recorded ones. The closure times the whole chain, copies included:
run chain suites for correctness (`--no-timing`).
"""

from __future__ import annotations

import torch

from attnbench.backend import Backend, get_backend, implements, register_backend
from attnbench.case import Case
from attnbench.errors import AttnbenchError, Unsupported
from attnbench.kernels.native_states import canonical_view
from attnbench.ops.gdn import CommitInputs, GDNInputs


def _steps(backend: ChainBackend, case: Case):
    return case.op.step_params(case.params)


def chain_limits(backend: ChainBackend, case: Case) -> str | None:
    """The first step whose backend is unknown, has no such kernel, declares no state layout, or whose
    declared limits refuse the step's case (None: every step can run)."""
    for i, (op, name, params) in enumerate(_steps(backend, case), 1):
        where = f"step {i} ({op}@{name})"
        try:
            b = backend.step_backend(name)
        except AttnbenchError as e:
            return f"{where}: {e}"
        impl = b.implementations.get(op)
        if impl is None:
            return f"{where}: {name} has no {op} kernel"
        if b.state_layout(op) is None:
            return f"{where}: {name} declares no state layout for {op} (it takes only the canonical pool)"
        if why := b.limits(Case(op, params, case.dtype, case.seed, device=case.device)):
            return f"{where}: {why}"
    return None


@register_backend("chain")
class ChainBackend(Backend):
    description = "gdn_chain: each step by the backend it names, on one state pool in the case's layout"
    substitutes: dict[str, Backend] = {}  # backend name -> the backend run instead (the self-test's mutants)

    def step_backend(self, name: str) -> Backend:
        return self.substitutes.get(name) or get_backend(name)

    @implements("gdn_chain", limits=chain_limits)
    def prepare_gdn_chain(self, case, x):
        return prepare(self, case, x)


def prepare(backend: ChainBackend, case: Case, x):
    p = case.params
    L = p.layout
    N, HV, K, V = x.state_pool.shape
    dims = {"kv": (K, V), "vk": (V, K)}
    dev = x.state_pool.device
    pool = torch.zeros(N + 1, HV, *dims[L], dtype=torch.float32, device=dev)  # + the scratch slot
    steps, log, inter = [], [], None
    for i, ((op, name, params), d) in enumerate(zip(_steps(backend, case), x.steps), 1):
        b = backend.step_backend(name)
        if why := b.available():
            raise Unsupported(f"step {i} ({op}@{name}): {why}")
        own = b.state_layout(op)
        if own == L:
            given, how = pool, "the pool itself"
        elif p.handoff == "raw":
            given, how = pool.view(N + 1, HV, *dims[own]), f"the {L} pool's memory as it is"
        else:
            given, how = (
                torch.empty(N + 1, HV, *dims[own], dtype=torch.float32, device=dev),
                f"converted {L} -> {own} -> {L}",
            )
        fields = {k: v for k, v in d.items() if k != "pool_after"}
        if op == "gdn_commit":
            inputs = CommitInputs(
                inter_states=inter, conv_states=x.conv_states, state_pool=given, state_layout=own, **fields
            )
        else:
            inputs = GDNInputs(**fields, A_log=x.A_log, dt_bias=x.dt_bias, state_pool=given, state_layout=own)
            inter = inputs.inter_states if op == "gdn_verify" else inter
        fn = b.prepare(Case(op, params, case.dtype, case.seed, device=case.device), inputs)
        converted = own != L and p.handoff == "convert"
        steps.append((fn, given if converted else None, own, d["pool_after"]))
        variant = (getattr(fn, "info", None) or {}).get("variant")
        log.append(f"{i}. {op}@{name} ({own}): {how}" + (f"; {variant}" if variant else ""))

    def run():
        canonical_view(pool[:N], L).copy_(x.state_pool)  # the pool enters the chain's layout
        outputs = {}
        for i, (fn, buffer, own, after) in enumerate(steps, 1):
            if buffer is not None:
                canonical_view(buffer[:N], own).copy_(canonical_view(pool[:N], L))
            out = fn()
            finalize = getattr(fn, "finalize", None)
            out = finalize(out) if finalize is not None else out
            if buffer is not None:
                canonical_view(pool[:N], L).copy_(canonical_view(buffer[:N], own))
            after.copy_(canonical_view(pool[:N], L))
            outputs |= {f"{k}@{i}": t for k, t in out.items()} | {f"state_pool@{i}": after}
        x.state_pool.copy_(canonical_view(pool[:N], L))
        return outputs

    run.info = {"pool": f"{L} fp32, {N} slots + 1 scratch", "handoff": p.handoff, "steps": log}
    return run
