"""The checks a row goes through, as data: an ordered list of `Check`s the runner applies in turn.

A check is a small object (docs/adding-a-check.md):

- `name`: its key in the row's `check_parts` (the seconds it took) and in messages;
- `needs`: what it does with the prepared call (harness/check/prepared.py), from `NEEDS`: only the first
  call's `outputs`; `call_again` (the closure on its own buffers); `fresh_call` (the backend
  prepared again on clean or other inputs); `perturb` (inputs changed in place under the closure).
  A check that needs more than the outputs does not run when they were malformed (wrong shape, dtype
  or device: nothing to compare a second call with);
- `records`: the row fields it sets (each one a field of attnbench.store.results.Result, or a new one,
  which the row keeps: Result allows extra fields);
- `applies(ctx)`: whether it runs on this case and backend;
- `run(ctx)`: appends its problems to `ctx.verdict.problems` (they fail the row) and returns the
  values of the fields it records.

The runner (harness/run/runner.py) knows no check by name: it builds a `CheckContext` per backend and
applies `CHECKS` (or the list it is given) in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from attnbench.buffers import bitwise_equal
from attnbench.check.checks import StaleCounts, Verdict, check, outputs_changed, stale_check, stale_variant
from attnbench.check.prepared import PreparedCall
from attnbench.check.replay import REPLAY_VARIANT, not_replayed, replay_outcome
from attnbench.check.tolerance import Rule

NEEDS = frozenset({"outputs", "call_again", "fresh_call", "perturb"})


@dataclass
class CheckContext:
    """What a check of one (case, backend) sees. `verdict` is shared: every check adds its problems.

    `expected`/`twin`: the float64 expectation and the native-precision twin of the pristine inputs;
    `outputs`: the first (checked) call's finalized outputs; `memo`: one dict per case and check
    name, shared by the backends of the case (e.g. the stale check's perturbed expectations);
    `ref_cache`: the run's reference cache (a harness/store/refcache.py RefCache) or None (off), for
    references a case determines besides its own (the replay check's batch B).
    """

    prepared: PreparedCall
    outputs: dict
    expected: dict
    twin: dict
    rule: Rule
    opts: Any  # attnbench.run.runner.RunOptions
    verdict: Verdict = field(default_factory=Verdict)
    memo: dict[str, dict] = field(default_factory=dict)
    ref_cache: Any = None
    _first: dict | None = None

    @property
    def case(self):
        return self.prepared.case

    @property
    def op(self):
        return self.prepared.case.op

    @property
    def params(self):
        return self.prepared.case.params

    @property
    def first(self) -> dict:
        """A copy of the first call's outputs, taken once (a second call may overwrite the buffers
        `outputs` are views of)."""
        if self._first is None:
            self._first = {k: v.clone() for k, v in self.outputs.items()}
        return self._first

    def memo_for(self, check_name: str) -> dict:
        return self.memo.setdefault(check_name, {})


@runtime_checkable
class Check(Protocol):
    name: str
    needs: frozenset[str]
    records: tuple[str, ...]

    def applies(self, ctx: CheckContext) -> bool: ...

    def run(self, ctx: CheckContext) -> dict[str, Any]: ...


def validate(checks: Sequence[Check]) -> None:
    """Refuse a check list the runner could not apply: unknown needs, two checks of one name or one
    recorded field written by two checks (TypeError naming the check)."""
    names: set[str] = set()
    fields: dict[str, str] = {}
    for c in checks:
        if not isinstance(c, Check):
            raise TypeError(f"{c!r} is not a Check (name, needs, records, applies, run)")
        if unknown := set(c.needs) - NEEDS:
            raise TypeError(f"check {c.name!r} needs {sorted(unknown)}; known: {sorted(NEEDS)}")
        if c.name in names:
            raise TypeError(f"two checks are named {c.name!r}")
        names.add(c.name)
        for f in c.records:
            if f in fields:
                raise TypeError(f"checks {fields[f]!r} and {c.name!r} both record {f!r}")
            fields[f] = c.name


def runnable(c: Check, ctx: CheckContext) -> bool:
    """A check that calls the closure again needs well-formed first outputs; then its own `applies`."""
    if ctx.verdict.malformed and set(c.needs) - {"outputs"}:
        return False
    return c.applies(ctx)


class OutputsCheck:
    """The first call's outputs and side effects against the float64 expectation (attnbench.check.checks.check):
    error sizes per output (the row's `metrics`), NaN/Inf, canaries, written and untouched inputs. What a
    comparison takes from the reference alone (slices, bounds) is computed once per case (`memo`)."""

    name = "outputs"
    needs = frozenset({"outputs"})
    records = ("metrics",)

    def applies(self, ctx: CheckContext) -> bool:
        return True

    def run(self, ctx: CheckContext) -> dict[str, Any]:
        p = ctx.prepared
        v = check(ctx.op, ctx.params, p.pristine, p.work, ctx.outputs, ctx.expected, ctx.twin, ctx.rule,
                  absent=p.absent, memo=ctx.memo_for(self.name))  # fmt: skip
        ctx.verdict.problems += v.problems
        ctx.verdict.metrics.update(v.metrics)
        ctx.verdict.malformed = ctx.verdict.malformed or v.malformed
        return {"metrics": ctx.verdict.metrics}


class DeterminismCheck:
    """Run-to-run determinism: `opts.determinism_repeats` more calls (harness/check/checks.py says why 5) must
    reproduce the first call's bits, except in the elements the op leaves unspecified (padding rows); an op
    that writes its inputs starts each from pristine inputs.
    Always recorded; it fails the row where the case requires it or the backend declares itself
    deterministic."""

    name = "determinism"
    needs = frozenset({"outputs", "call_again", "fresh_call"})
    records = ("deterministic",)

    def applies(self, ctx: CheckContext) -> bool:
        return True

    def run(self, ctx: CheckContext) -> dict[str, Any]:
        case, p = ctx.case, ctx.prepared
        first, same = ctx.first, True
        free = ctx.op.unspecified(ctx.params, p.pristine)  # elements any value fits, each call its own
        for _ in range(ctx.opts.determinism_repeats):
            # the call moved its inputs on (states, caches): again from pristine
            again = p.fresh_call() if ctx.op.writes_for(ctx.params) else p.call()
            p.sync()
            if outputs_changed(first, again, free):
                same = False
                break
        promised = "deterministic" in case.require or getattr(p.backend, "deterministic", False) is True
        if not same and promised:
            why = (
                "required here"
                if "deterministic" in case.require
                else f"{p.backend.name} declares itself deterministic"
            )
            ctx.verdict.problems.append(f"not deterministic ({why}): calls on the same inputs gave different bits")
        return {"deterministic": same}


class BatchInvarianceCheck:
    """Batch invariance (when the run, the case or a requirement asks): request 0 alone, and the whole
    batch reversed, must reproduce the batch's outputs bit for bit (None: the op has no sub-batches)."""

    name = "invariance"
    needs = frozenset({"outputs", "fresh_call"})
    records = ("batch_invariant",)

    def applies(self, ctx: CheckContext) -> bool:
        case = ctx.case
        return bool(ctx.opts.invariance or case.invariance or "batch_invariant" in case.require)

    def run(self, ctx: CheckContext) -> dict[str, Any]:
        got = batch_invariant(ctx.prepared, ctx.first)
        if got is False and "batch_invariant" in ctx.case.require:
            ctx.verdict.problems.append("not batch invariant: a request's output changed with the batch around it")
        return {"batch_invariant": got}


def batch_invariant(p: PreparedCall, reference: dict) -> bool | None:
    """Request 0 alone, and the whole batch reversed, must reproduce the batch's outputs bit for bit."""
    op, params, pristine = p.case.op, p.case.params, p.pristine
    n = len(pristine.seq_lens_host) if hasattr(pristine, "seq_lens_host") else None
    n = n if n is not None else next(iter(reference.values())).shape[0]
    for order in ([0], list(range(n))[::-1]) if n > 1 else ([0],):
        sub = op.subset(params, pristine, order)
        if sub is None:
            return None
        inputs, rows = sub
        got = p.fresh_call(inputs)
        p.sync()
        for k, ref_out in reference.items():
            if not bool(bitwise_equal(got[k], ref_out[rows]).all()):
                return False
    return True


class StaleOutputCheck:
    """Every input the op reads changed in place (`Op.perturbations`), the closure called again: every
    output must follow (attnbench.check.checks.stale_check; a failing re-run counts only where a freshly
    prepared closure passes the same changed inputs). Records its problem, and what it cost: the
    re-runs (`stale_reruns`) and the perturbed float64 expectations this row computed (`stale_references`)."""

    name = "stale"
    needs = frozenset({"outputs", "call_again", "perturb", "fresh_call"})
    records = ("stale_reruns", "stale_references")

    def applies(self, ctx: CheckContext) -> bool:
        return True

    def run(self, ctx: CheckContext) -> dict[str, Any]:
        p, case = ctx.prepared, ctx.case
        counts = StaleCounts()
        stale_check(ctx.op, ctx.params, p.pristine, p.call, p.work, ctx.verdict, p.sync, ctx.rule, case.torch_dtype,
                    p.absent, ctx.memo_for(self.name), fresh=p.fresh_call_on, first=ctx.first, counts=counts,
                    planned=p.planned, cache=ctx.ref_cache, case=case)  # fmt: skip
        return {"stale_reruns": counts.reruns, "stale_references": counts.references}

    def reference_variants(self, case, opts) -> tuple[str, ...]:
        """The reference-cache entries this check may read for `case` (the runner reads them ahead): the
        perturbed expectations of an op that writes no input, one per perturbation."""
        op, p = case.op, case.params
        if op.writes_for(p):
            return ()
        return tuple(stale_variant((pert.name,)) for pert in op.perturbations(p))


class ReplayCheck:
    """CUDA-graph replay (attnbench.check.replay, docs/replay.md), for ops servers capture in graphs
    (`Op.graph_captured`): the closure captured on the case's batch, another batch of the same shapes
    (other lengths, tables, slots, a padding request) written into its inputs in place, the graph
    replayed, and the outputs checked against the other batch's float64 reference. Records `replay`:
    pass, fail, or `skip: why` (a backend not declared graph-safe, `implements(graph_safe=...)`; a CPU;
    `--no-replay`). `graph`: a factory `graph(device)` of the graph object (tests: `StandInGraph`)."""

    name = "replay"
    needs = frozenset({"outputs", "call_again", "perturb"})
    records = ("replay",)

    def __init__(self, graph=None):
        self.graph = graph

    def applies(self, ctx: CheckContext) -> bool:
        return ctx.op.graph_captured

    def run(self, ctx: CheckContext) -> dict[str, Any]:
        enabled = getattr(ctx.opts, "replay", True)
        outcome, problems = replay_outcome(ctx.prepared, ctx.rule, enabled, ctx.memo_for(self.name), self.graph,
                                           ctx.ref_cache)  # fmt: skip
        ctx.verdict.problems += problems
        return {"replay": outcome}

    def _replays(self, case, opts, inputs=None) -> bool:
        """Whether this check replays `case` under `opts` for a backend that declares its closure graph-safe
        (`replay.not_replayed`, the one statement of the conditions `replay_outcome` goes by)."""
        return not_replayed(case, getattr(opts, "replay", True), self.graph, inputs) is None

    def build_ahead(self, case, inputs, opts):
        """Batch B of `case` from its CPU `inputs` (`Op.replay_batch`: a second full draw of the case's
        data), built on the runner's background thread before the case starts (run/inputs_ahead.py);
        `replay.batch_b` takes it from the memo. None where the check will not replay this case."""
        if not self._replays(case, opts, inputs):
            return None
        return case.op.replay_batch(case.params, inputs, case.torch_dtype, case.seed)

    def reference_variants(self, case, opts) -> tuple[str, ...]:
        """The reference-cache entry this check may read for `case` (the runner reads it ahead): batch B's
        reference, kept for an op that writes nothing (harness/check/replay.py `batch_b`)."""
        return (REPLAY_VARIANT,) if self._replays(case, opts) and not case.op.writes_for(case.params) else ()


# The order matters: the outputs first (they make the verdict every other check adds to), then the
# checks that call the closure again on the same inputs, then those that change its inputs.
CHECKS: tuple[Check, ...] = (
    OutputsCheck(), DeterminismCheck(), BatchInvarianceCheck(), StaleOutputCheck(), ReplayCheck(),
)  # fmt: skip
validate(CHECKS)

_ACTIVE: list[Check] = list(CHECKS)


def register_check(c: Check, before: str | None = None) -> Check:
    """Add `c` to the checks every row goes through (from a `--plugin` module, which worker processes
    import too): before the check named `before`, else last. Refused (TypeError) like `validate`."""
    names = [x.name for x in _ACTIVE]
    if before is not None and before not in names:
        raise TypeError(f"register_check({c!r}, before={before!r}): no such check; known: {names}")
    at = names.index(before) if before is not None else len(_ACTIVE)
    validate([*_ACTIVE[:at], c, *_ACTIVE[at:]])
    _ACTIVE.insert(at, c)
    return c


def active() -> tuple[Check, ...]:
    """The checks a run applies when its options name none: CHECKS and the registered ones, in order."""
    return tuple(_ACTIVE)
