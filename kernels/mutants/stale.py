"""Closures that cache an input at `prepare`: one mutant per class of inputs the ops read.

Each wraps the torch backend, but hands its closure a copy of some inputs taken at `prepare` (the
queries, the page table, the slots, ...), so every later call computes from the inputs as they were
then, while the other inputs are read as they are now: what a kernel that converts, packs or plans
from an input once and reuses it does in a server, which rewrites every input in place between steps.
The stale-output check (harness/check/checks.py `stale_check`) must catch each: it changes every input an
op reads (`Op.perturbations`) and requires the outputs to follow.

The fields are written here, per op, apart from the ops' declarations, so a class of inputs an op
forgets to perturb leaves its mutant uncaught. A mutant does not touch outputs or the inputs a case
writes (caches, state pools); where a case has none of its fields (no sinks, no fp8 scales) it skips.
Inputs an op holds (`Op.held`: lengths, attention page tables, model weights such as fp8 scales, sinks,
gate parameters and conv weights) have no mutant here: the check does not change them, so it could not
catch one (docs/conventions.md says why they are held).
"""

from __future__ import annotations

import dataclasses

from attnbench.backend import Backend, get_backend
from attnbench.errors import Unsupported

ATTENTION = ("decode", "extend", "tree_verify")
GDN = ("gdn_decode", "gdn_extend", "gdn_verify")


def _each(ops: tuple[str, ...], fields: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return dict.fromkeys(ops, fields)


# (class of inputs, what the bug is, op -> the fields it snapshots)
STALE_INPUTS: tuple[tuple[str, str, dict[str, tuple[str, ...]]], ...] = (
    ("queries", "the queries", _each(ATTENTION + GDN, ("q",))),
    ("keys", "the keys", _each(ATTENTION, ("k_cache", "k_new")) | _each(GDN, ("k",))),
    ("values", "the values",
     _each(ATTENTION, ("v_cache", "v_new")) | _each(GDN, ("v",)) | {"merge_state": ("v_a", "v_b")}),
    ("custom-mask", "the custom mask", {"extend": ("custom_mask",)}),
    ("lses", "the partial states' LSEs", {"merge_state": ("s_a", "s_b")}),
    ("raw-gates", "the raw gates a, b", _each(("gdn_gating", "gdn_decode", "gdn_verify"), ("a", "b"))),
    ("gates", "the gates g, beta", {"gdn_extend": ("g", "beta")}),
    ("conv-inputs", "the conv inputs x", {"causal_conv1d": ("x",)}),
    ("slots", "the state slots of the requests",
     {"causal_conv1d": ("cache_indices",), "gdn_commit": ("state_indices",)} | _each(GDN, ("state_indices",))),
    ("initial-state-flags", "has_initial_state", _each(("causal_conv1d", "gdn_extend"), ("has_initial_state",))),
    ("read-only-states", "the state pool it only reads (verify)",
     {"causal_conv1d": ("conv_states",)}),
    ("tree-parents", "the tree's parents", _each(("causal_conv1d", "gdn_verify"), ("parents",))),
    ("verify-states", "the verify buffers", {"gdn_commit": ("inter_states", "inter_conv_windows")}),
    ("accepted-tokens", "the last accepted token per request", {"gdn_commit": ("last_accepted",)}),
    ("draft", "the draft (parent_list, selected_index)", {"eagle_build_tree": ("parent_list", "selected_index")}),
    ("prefix-lengths", "the prefix lengths", {"eagle_build_tree": ("seq_lens",)}),
    ("target-tokens", "the target's tokens", {"verify_greedy": ("target_predict",)}),
    ("draft-tokens", "the draft tokens", {"verify_greedy": ("candidates",)}),
    ("retrieve-index", "the retrieve index", {"verify_greedy": ("retrive_index",)}),
    ("tree-links", "the tree links", {"verify_greedy": ("retrive_next_token", "retrive_next_sibling")}),
)  # fmt: skip


def snapshot_backend(name: str, fields: dict[str, tuple[str, ...]]) -> Backend:
    """A torch-backed backend whose closure reads copies of `fields[op]` taken at `prepare`."""

    def prepare(self, case, x):
        writes = set(case.op.writes_for(case.params)) | set(case.op.outputs_for(case.params))
        names = [f for f in fields[case.op_name] if f not in writes and getattr(x, f, None) is not None]
        if not names:
            raise Unsupported(f"{case.op_name}: this case has none of {', '.join(fields[case.op_name])}")
        frozen = dataclasses.replace(x, **{f: getattr(x, f).clone() for f in names})
        return get_backend("torch").prepare(case, frozen)

    methods = {f"prepare_{op}": prepare for op in fields}
    return type(f"Snapshot_{name}", (Backend,), {"name": name, **methods})()


STALE_MUTANTS = tuple(
    (f"stale-{label}", f"reads {what} as they were at prepare (a copy it made then)", fields)
    for label, what, fields in STALE_INPUTS
)
