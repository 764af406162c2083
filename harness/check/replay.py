"""The replay check's sequence: a closure captured in a CUDA graph on one batch, replayed on another.

A server captures decode and verify once per padded batch-size bucket and replays the graph for every
later batch of that bucket, after writing the new batch's metadata and inputs into the captured
tensors in place (sequence lengths, page tables, slots, padding rows). Whatever the closure decided
on the host for the batch it was captured on (a split count, a maximum length, a grid, a pointer to
a temporary, a value read with `.item()`) is frozen into the graph: right eagerly, wrong on replay.

`replay(prepared, graph, rule, memo)` runs the sequence on a `PreparedCall` (docs/replay.md):

1. the closure's read inputs back to the case's own (batch A, as `prepare` saw them);
2. a warm-up call (on a side stream for a CUDA graph: autotuning, lazy initialisation, JIT), then its
   `finalize`; then the capture of one call;
3. batch B from the op (`Op.replay_batch`: the same tensor shapes, other lengths, tables, slots,
   data, a padding request where the op has them), its float64 expectation and twin;
4. every tensor of B written into the closure's buffers in place (outputs back to their NaN fill),
   then the closure's `before_replay()` if it has one (a server's metadata step before a replay);
5. one replay, `finalize`, and B's outputs and written inputs checked like the first call's
   (`checks.check`, the same tolerance rule; what it takes from B's reference alone is computed once
   for the rows of a case that share B, in `memo`);
6. the read inputs back to A's (the closure is timed on the case's inputs afterwards).

The graph is an object with `warm_up(fn)`, `capture(fn) -> outputs` and `replay()`: `CudaGraph` on a
GPU; `StandInGraph` lets CPU tests drive the same sequence (module `StandInGraph` says how it differs).
"""

from __future__ import annotations

from typing import Any

import torch

from attnbench.buffers import storage_bytes, tensor_fields
from attnbench.check.checks import Problem, _reset_from, _storages_equal, check, outputs_contract, subjects
from attnbench.check.prepared import PreparedCall
from attnbench.errors import describe
from attnbench.graph_capture import capturing
from attnbench.ops.replay_batches import keep_from
from attnbench.ops.rng import to_device

# Inputs larger than this are not replayed: batch B is another copy of them (and is kept for the case's
# other backends where the op writes nothing); the large suite's pools of several GiB would not fit twice.
REPLAY_MAX_BYTES = 2**30


class CudaGraph:
    """A `torch.cuda.CUDAGraph` as a server uses one: a warm-up call on a side stream, then the capture."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.graph: torch.cuda.CUDAGraph | None = None

    def warm_up(self, fn) -> Any:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            out = fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        return out

    def capture(self, fn) -> Any:
        torch.cuda.synchronize(self.device)
        self.graph = torch.cuda.CUDAGraph()
        with capturing(self.graph):
            out = fn()
        return out

    def replay(self) -> None:
        self.graph.replay()


class StandInGraph:
    """The CPU stand-in of `CudaGraph` (tests): `capture` records the closure without running it (and hands
    back the warm-up's outputs: a closure returns its preallocated buffers), `replay` calls it again and
    copies what it returns into those buffers. What the closure took on the host at prepare (a length,
    a schedule, a grid) stays as it was, as in a graph; unlike a graph, a host read of a device tensor
    inside the call (`.item()`, `.tolist()`) sees batch B, so such a closure passes here and not on a GPU."""

    def __init__(self, device=None):
        self.fn = None
        self.outputs: Any = None

    def warm_up(self, fn) -> Any:
        self.outputs = fn()
        return self.outputs

    def capture(self, fn) -> Any:
        self.fn = fn
        return self.outputs

    def replay(self) -> None:
        got = self.fn()
        for name, t in (got or {}).items():
            static = self.outputs.get(name) if isinstance(self.outputs, dict) else None
            if isinstance(static, torch.Tensor) and static is not t:
                static.copy_(t)


def restore_reads(op, params, work: Any, source: Any) -> None:
    """Every tensor of `work` but the inputs the case writes gets `source`'s bits in place (the written
    ones, pools a backend may hold in its own layout, stay as the closure's calls left them)."""
    written = set(op.writes_for(params))
    keep = {work_t.untyped_storage().data_ptr() for n, work_t in tensor_fields(work).items() if n in written}
    done = set(keep)
    for name, t in tensor_fields(work).items():
        key = t.untyped_storage().data_ptr()
        if key not in done:
            done.add(key)
            t.untyped_storage().copy_(getattr(source, name).untyped_storage())


SHOWN = 6  # items of a long list a message shows (its length is said)


def brief(values: list) -> str:
    """A list for a one-line message: whole up to `SHOWN + 2` items, else its first `SHOWN` and its length."""
    if len(values) <= SHOWN + 2:
        return str(values)
    return "[" + ", ".join(map(str, values[:SHOWN])) + f", … ({len(values)} in all)]"


def what_changed(a: Any, b: Any) -> str:
    """Batch A -> B in a few words, for messages: the lengths, else the slots (long lists cut, `brief`)."""
    if getattr(a, "seq_lens_host", ()) and a.seq_lens_host != b.seq_lens_host:
        return f"lengths {brief(list(a.seq_lens_host))} -> {brief(list(b.seq_lens_host))}"
    if hasattr(a, "state_indices"):
        return f"slots {brief(a.state_indices.tolist())} -> {brief(b.state_indices.tolist())}"
    return "other data"


REPLAY_VARIANT = "replay batch B"  # B's reference in the reference cache (refcache.key_material's variant)


def batch_b(
    op, params, work: Any, dtype: torch.dtype, seed: int, memo: dict | None, cache=None, case=None
) -> tuple | str:
    """`(params, inputs, expected, twin)` of batch B (`Op.replay_batch`), or why there is none.

    B is drawn once per case (`memo`, shared by the case's backends): its fields but `Op.replay_kept`
    depend on the case alone, and each later row gets those kept fields from its own inputs `work`
    (`keep_from`: clones, as `replay_batch` takes them). For an op that writes nothing B is then the
    same for every backend, and so is its float64 expectation and twin, which the reference cache
    (`cache`, a harness/store/refcache.py RefCache, or None) keeps under `case`'s key with the variant
    REPLAY_VARIANT: a second run computes none. The first B may come built on the CPU ahead (`memo`'s
    "ahead": `Op.replay_batch` of the case's CPU inputs, whose kept fields are replaced by this row's):
    the same tensors `Op.replay_batch` of `work` gives. For an op that writes inputs (a state pool, as the
    backend's calls left it) the expectation is the first row's where this row's B is bitwise that
    row's (`_storages_equal`), else computed for this row (not cached: the pool is the backend's)."""
    pure = not op.writes_for(params)
    if memo is None:
        memo = {}
    first = memo.get("batch")
    if isinstance(first, str) or (pure and first is not None):
        return first
    if first is None:
        got = memo.pop("ahead", None)  # built on the CPU before the case started (ReplayCheck.build_ahead)
        if got is None:
            got = op.replay_batch(params, work, dtype, seed)
        elif not isinstance(got, str):  # the CPU batch on this row's device, with this row's kept fields
            got = got[0], keep_from(to_device(got[1], _device_of(work)), work, op.replay_kept(params))
        if isinstance(got, str):
            memo["batch"] = got
            return got
        pb, xb = got
    else:
        pb, xb = first[0], keep_from(first[1], work, op.replay_kept(params))
        if _storages_equal(first[1], xb):
            return first
    hit = cache.get(case, xb, REPLAY_VARIANT)[0] if pure and cache is not None and case is not None else None
    if hit is None:
        hit = op.expected(pb, xb, torch.float64), op.expected(pb, xb, dtype)
        if pure and cache is not None and case is not None:
            cache.put(case, *hit, xb, REPLAY_VARIANT)
    got = (pb, xb, *hit)
    if first is None:
        memo["batch"] = got
    return got


def _device_of(x: Any) -> torch.device:
    return next(iter(tensor_fields(x).values())).device


def replay(p: PreparedCall, graph, rule, memo: dict | None = None, cache=None) -> tuple[str, list[str]]:
    """The sequence of the module docstring on `p` with `graph`: `(outcome, problems)`, the outcome
    `"pass"`, `"fail"` (the first problem of batch B, in `problems`) or `"skip: why"` (the op has no
    batch B for this case). `cache`: the reference cache for B's reference (`batch_b`)."""
    case, op, params = p.case, p.case.op, p.case.params
    work, fn = p.work, p.fn
    finalize = getattr(fn, "finalize", None)
    before = getattr(fn, "before_replay", None)
    restore_reads(op, params, work, p.pristine)
    p.sync()
    out = graph.warm_up(fn)
    if finalize is not None:
        finalize(out)
    p.sync()
    try:
        static = graph.capture(fn)
    except Exception as e:  # a sync, an allocation or a host read inside the call
        restore_reads(op, params, work, p.pristine)
        return "fail", [f"replay: the closure could not be captured in a CUDA graph: {describe(e)}"]
    got = batch_b(op, params, work, case.torch_dtype, case.seed, memo, cache, case)
    if isinstance(got, str):
        return f"skip: {got}", []
    pb, xb, expected, twin = got
    change = what_changed(p.pristine, xb)
    try:
        _reset_from(work, xb)  # the captured pointers now hold batch B
        if before is not None:  # the host-side step a server runs before each replay (harness/backend.py)
            before()
        p.sync()
        graph.replay()
        p.sync()
        outputs = finalize(static) if finalize is not None else static
        if broken := outputs_contract(op, pb, outputs, p.absent):
            return "fail", [f"replay: {broken}"]
        # what the comparison takes from B's reference alone, kept for the case's next rows with the same B
        sides = memo.setdefault("reference sides", {}) if memo is not None else None
        v = check(op, pb, xb, work, outputs, expected, twin, rule, absent=p.absent, memo=sides)
    finally:
        restore_reads(op, params, work, p.pristine)
    if not v.problems:
        return "pass", []
    more = f" (and {len(v.problems) - 1} more)" if len(v.problems) > 1 else ""
    names = op.checked_names(pb)
    return "fail", [
        Problem(
            f"replay: captured on one batch, replayed on another of the same shapes ({change}), the closure did "
            f"not follow: {v.problems[0]}{more}",
            [f"replay:{s}" for s in subjects(v.problems, names)],
        )
    ]


def not_replayed(case, enabled: bool = True, graph=None, inputs=None) -> str | None:
    """Why the replay check does not replay `case` whatever its backend declares (None: it does):
    replay turned off (`--no-replay`), no CUDA device and no stand-in `graph` factory, an op servers do
    not capture (`Op.graph_captured`), or `inputs` (where given) over `REPLAY_MAX_BYTES`."""
    if not case.op.graph_captured:
        return "not captured by servers (Op.graph_captured)"
    if not enabled:
        return "off (--no-replay)"
    if graph is None and not case.on_cuda:
        return f"no CUDA graphs on {case.device}"
    if inputs is not None and (n := storage_bytes(inputs)) > REPLAY_MAX_BYTES:
        return f"inputs of {n / 2**30:.1f} GiB (over {REPLAY_MAX_BYTES / 2**30:.0f} GiB: batch B would be another copy)"
    return None


def replay_outcome(
    p: PreparedCall, rule, enabled: bool = True, memo: dict | None = None, graph=None, cache=None
) -> tuple:
    """The replay check of one row: `replay(...)` where it runs, else `("skip: why", [])`. `graph`: a
    factory `graph(device)` (default: `CudaGraph`, on CUDA devices only); `cache`: `replay`'s."""
    declared = p.backend.graph_safe(p.case)
    if declared is None:
        return "skip: not declared graph-safe", []
    if declared is not True:
        return f"skip: not graph-safe: {declared}", []
    if why := not_replayed(p.case, enabled, graph, p.pristine):
        return f"skip: {why}", []
    return replay(p, (graph or CudaGraph)(p.case.device), rule, memo, cache)
