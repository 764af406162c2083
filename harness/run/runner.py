"""Run cases: reference once per case, then every backend prepared, checked and timed the same way.

For one case: backends that do not support it become `skip` rows; the inputs are built once and the
float64 reference and the native-precision twin computed once; each backend gets its own clone of the
inputs, `prepare` (timed apart, by host clock), one checked call, then the checks of
`RunOptions.checks` in order (harness/check/checklist.py: outputs, determinism repeats, batch invariance,
stale output); then the closures of all backends that ran are timed together, interleaved. Any
exception becomes an `error` row for that backend only; when the shared timing raises, each closure is
timed again alone (`_after_shared`). The runner knows no check by name.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnbench.backend import Backend
from attnbench.buffers import clone_tensors, storage_bytes
from attnbench.case import Case
from attnbench.check.checklist import CheckContext, active, runnable
from attnbench.check.checks import DETERMINISM_REPEATS, outputs_contract, subjects
from attnbench.check.prepared import PreparedCall, call_untimed, sync_device
from attnbench.check.tolerance import Rule, rule_for
from attnbench.errors import Unsupported, describe, out_of_memory
from attnbench.ops.rng import to_device
from attnbench.run import inputs_ahead
from attnbench.run.peaks import roofline
from attnbench.run.timing import Rotation, TimingConfig, TimingStats, spent, time_closures
from attnbench.store.results import Result


@dataclass(frozen=True)
class RunOptions:
    timing: bool = True
    timing_config: TimingConfig | None = None
    invariance: bool = False  # check batch invariance for every case (else only where a suite requires it)
    peaks: dict | None = None  # attnbench.run.peaks.get_peaks() of the device: adds the roofline to `derived`
    # calls after the checked one that must reproduce its bits (harness/check/checks.py says why 5); fewer only
    # where the execution cannot vary between calls (tests of kernels under the Triton interpreter)
    determinism_repeats: int = DETERMINISM_REPEATS
    ref_cache: str | None = None  # reference cache directory (harness/store/refcache.py); None: off
    ref_cache_max: int | None = None  # its cap in bytes; None: refcache.default_max_bytes()
    checks: tuple | None = None  # the checks every row goes through, in order; None: checklist.active()
    replay: bool = True  # the CUDA-graph replay check (GPU rows of graph-safe backends; docs/replay.md)


class ContextLost(Exception):
    """A backend broke the CUDA context (illegal address, device assert): nothing more can run here.

    Carries the rows finished so far (the culprit's error row included); the process must end. `alone`:
    backends whose rows are in `rows` but whose verdict is not their own (timed together when the context
    was lost, or not timed): a supervisor that can start a fresh process runs each of them there alone.
    """

    def __init__(self, rows: list[Result], reason: str, alone: tuple[str, ...] = ()):
        super().__init__(reason)
        self.rows, self.reason, self.alone = rows, reason, tuple(alone)


_STICKY = ("illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
           "illegal instruction", "an illegal", "CUDA error: unknown error", "uncorrectable ECC")  # fmt: skip


def context_lost(e: BaseException) -> bool:
    """True for the CUDA errors after which the context is unusable."""
    return isinstance(e, RuntimeError) and any(s in str(e) for s in _STICKY)


KEPT_WATCH_BYTES = 2**30  # cases with inputs this large check what each backend leaves allocated
KEPT_NOTE_BYTES = 64 * 2**20


def _watch_kept(case: Case, opts: RunOptions, built: _Built) -> bool:
    """Whether each backend's row of this case is checked for device memory it leaves allocated: GPU
    cases with inputs of KEPT_WATCH_BYTES or more, correctness only (timing keeps every closure)."""
    return case.on_cuda and not opts.timing and storage_bytes(built.pristine) >= KEPT_WATCH_BYTES


def _freeze_heap() -> None:
    """Collect, then move every live object to the collector's permanent generation (`gc.freeze`), at the
    start of a GPU case: the collections a case makes (after each check of inputs from
    COLLECT_FROM_BYTES on, `_allocated`) then walk only what was made since, not the imported libraries'
    millions of objects (on an H100 a full collection took 0.3 s, 36 of them in one `ci` sweep). Frozen
    objects are still freed by reference counting; what a case makes is never frozen during it, and
    garbage a case leaves in reference cycles is collected here, at the next case's start, before the
    freeze."""
    gc.collect()
    gc.freeze()


def _allocated() -> int:
    """Device memory held by live tensors, after a collection (a dropped closure's cycles freed)."""
    gc.collect()
    return torch.cuda.memory_allocated()


def _note_kept(row: Result, kept: int) -> None:
    """Device memory a backend's row left allocated once its closure was dropped (a leak: a cache of
    tensors, an exception kept alive) goes into the row's prepare_info (`kept_gib`): the next backend's
    out-of-memory error then has a named cause."""
    if kept >= KEPT_NOTE_BYTES:
        row.prepare_info = dict(row.prepare_info or {}) | {"kept_gib": round(kept / 2**30, 2)}


def _held(built: _Built, memo: dict) -> str:
    """What the case itself holds while its backends run, for an out-of-memory reason: the inputs (each
    backend clones them once more), the float64 expectation, the twin and the checks' shared copies."""
    parts = {
        "case inputs": storage_bytes(built.pristine),
        "float64 expectation": storage_bytes(built.expected),
        "twin": storage_bytes(built.twin),
        "checks' shared copies": storage_bytes(memo),
    }
    held = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in parts.items() if v or k == "case inputs")
    return f"{held}; the inputs cloned once per backend"


def _sync(case: Case) -> None:
    sync_device(case)


def error_row(case: Case, backend: str, reason: str, env: dict | None = None) -> Result:
    """An `error` row for a backend that could not finish `case` (crash, timeout)."""
    return _row(case, backend, "error", reason, env=env or {})


def _row(case: Case, backend: str, status: str, reason: str = "", **kw) -> Result:
    return Result(
        case_id=case.id,
        op=case.op_name,
        backend=backend,
        status=status,
        reason=reason,
        params=case.params.model_dump(),
        dtype=case.dtype,
        seed=case.seed,
        suite=case.suite,
        count=case.count,
        features=list(case.features),
        tolerance_why=case.tolerance.why if case.tolerance else "",
        **kw,
    )


def _supports(backend: Backend, case: Case) -> str | None:
    try:
        return backend.supports(case)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # a plugin whose supports() raises is an error, not a crash
        raise _SupportsFailed(f"supports() raised {describe(e)}") from e


class _SupportsFailed(Exception):
    pass


def triage(case: Case, backends: list[Backend], env: dict | None = None) -> tuple[dict[str, Result], list[Backend]]:
    """Rows for the backends that skip `case` (or whose `supports` raises), and the backends that run it."""
    rows: dict[str, Result] = {}
    todo: list[Backend] = []
    for b in backends:
        try:
            reason = _supports(b, case)
        except _SupportsFailed as e:
            rows[b.name] = _row(case, b.name, "error", str(e), env=env or {})
            continue
        if reason:
            rows[b.name] = _row(case, b.name, "skip", reason, env=env or {})
        else:
            todo.append(b)
    return rows, todo


def run_case(
    case: Case,
    backends: list[Backend],
    opts: RunOptions,
    env: dict | None = None,
    on_stage: Callable[[str], None] | None = None,
    ahead: Case | None = None,
) -> list[Result]:
    """All rows of one case, in backend order.

    `on_stage(name)` is told which backend is about to run (`"timing"` for the shared timing phase,
    `"reference"` before inputs and references) so a supervisor can attribute a crash or a timeout.
    Raises ContextLost when a backend broke the CUDA context. Runs with the case's GPU as the current
    device (kernels that launch on the current device, like Triton's, then find their tensors).
    `ahead`: the case likely to run next here, whose reference-cache entries are read (`_read_ahead`)
    and whose CPU inputs are built (run/inputs_ahead.py) on background threads while this case runs;
    both are waited for before this case's timing.
    """
    t0 = time.perf_counter()
    with torch.cuda.device(torch.device(case.device)) if case.on_cuda else contextlib.nullcontext():
        rows = _run_case(case, backends, opts, env, on_stage, ahead)
    case_s = time.perf_counter() - t0
    for r in rows:
        r.case_s = case_s
    return rows


def _run_case(case, backends, opts, env, on_stage, ahead=None) -> list[Result]:
    """Orchestration only: triage, the case's inputs and reference, each backend prepared and checked
    (`_run_backend`), then the closures timed together (`_time`)."""
    from attnbench.store import refcache

    env = env or {}
    stage = on_stage or (lambda name: None)
    rows, todo = triage(case, backends, env)
    if todo and case.on_cuda:
        _freeze_heap()
    cache = refcache.open_cache(opts.ref_cache, opts.ref_cache_max)
    if cache is not None:
        _read_ahead(cache, [case] if todo else [], ahead, opts)
    t0 = time.perf_counter()
    own = inputs_ahead.take(case) if todo else None  # built by the case before this one (run/inputs_ahead.py)
    waited = time.perf_counter() - t0
    inputs_ahead.schedule([ahead] if ahead is not None else [], _extras(opts))  # beside this case's backends
    if todo:
        stage("reference")
        built = _build(case, opts, cache, own, waited)
        if isinstance(built, _BuildFailed):
            e = built.error
            for b in todo:
                rows[b.name] = _row(case, b.name, "error", f"building inputs/reference failed: {describe(e)}{built.size}",
                                    env=env)  # fmt: skip
            if context_lost(e):
                raise ContextLost([rows[b.name] for b in backends if b.name in rows], str(e)) from e
        else:
            closures: dict[str, Callable] = {}
            # per check: what the backends of the case share, from the checks' work built ahead on
            memo: dict[str, dict] = {name: {"ahead": got} for name, got in built.ahead.items() if got is not None}
            watch = _watch_kept(case, opts, built)
            for b in todo:
                stage(b.name)
                before = _allocated() if watch else 0
                rows[b.name], fn = _run_backend(case, b, built, opts, env, memo, rows)
                if fn is not None:
                    # without timing nothing calls it again: drop it, so its copy of the inputs (a production-size
                    # pool of gigabytes, suites/large.yaml) is freed before the next backend's is made
                    closures[b.name] = fn if opts.timing else None
                del fn
                if watch:
                    _note_kept(rows[b.name], _allocated() - before)
            _time(case, todo, built, closures, rows, opts, stage)
    return [rows[b.name] for b in backends]


@dataclass
class _Built:
    """A case's inputs and references, built once and shared by its backends."""

    pristine: object
    expected: dict
    twin: dict
    shared: dict  # the fields every row of the case carries (reference_s, inputs_s, reference_from...)
    flops: float
    nbytes: float
    rule: Rule
    ref_cache: Any = None  # the run's reference cache (harness/store/refcache.py), None when off
    ahead: dict = field(default_factory=dict)  # per check: what its `build_ahead` made (run/inputs_ahead.py)


@dataclass
class _BuildFailed:
    error: Exception
    size: str  # " (inputs N GiB)" when the inputs were built, else ""


def _extras(opts: RunOptions):
    """For `inputs_ahead.schedule`: per case, each check's `build_ahead(case, cpu inputs, opts)` (an
    optional method: CPU work from the inputs alone, done on the background thread)."""
    checks = [c for c in (opts.checks if opts.checks is not None else active()) if hasattr(c, "build_ahead")]

    def extras(case: Case) -> dict:
        return {c.name: functools.partial(c.build_ahead, case, opts=opts) for c in checks}

    return extras


def _read_ahead(cache, cases: list[Case], ahead: Case | None, opts: RunOptions) -> None:
    """Start reading the reference-cache entries of `cases` (this one, when it runs) and of `ahead` on a
    background thread (harness/store/refcache.py, Reading ahead): each case's own entry and those its
    checks name (`reference_variants(case, opts)`, an optional method of a check: e.g. the replay check's
    batch B). A problem here only means no read ahead: `get` reads the entry itself."""
    checks = opts.checks if opts.checks is not None else active()
    wanted = []
    for c in [*cases, *([ahead] if ahead is not None else [])]:
        wanted.append((c, ""))
        for chk in checks:
            variants = getattr(chk, "reference_variants", None)
            try:
                wanted += [(c, v) for v in (variants(c, opts) if variants else ())]
            except Exception:  # a plugin check's hook: its entries are read when asked for
                continue
    try:
        cache.read_ahead(wanted)
    except Exception:
        pass


def _build(case: Case, opts: RunOptions, cache=None, built_ahead=None, waited: float = 0.0) -> _Built | _BuildFailed:
    """The case's inputs, the float64 reference and the twin, FLOPs, bytes and the tolerance rule;
    or what went wrong. `cache`: the run's reference cache (None: off); `built_ahead`: the case's CPU
    inputs and its checks' extras from `inputs_ahead.take` (None: built here), `waited` seconds for them."""
    op, p = case.op, case.params
    pristine = None
    try:
        t0 = time.perf_counter() - waited
        pristine = to_device(built_ahead[0], case.device) if built_ahead is not None else case.make_inputs()
        _sync(case)
        inputs_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        expected, twin, ref = _reference(case, pristine, cache)
        ref_s = time.perf_counter() - t0
        flops, nbytes = op.flops(p, pristine), op.bytes(p, pristine)
    except Exception as e:
        return _BuildFailed(e, f" (inputs {storage_bytes(pristine) / 2**30:.2f} GiB)" if pristine is not None else "")
    shared = {"reference_s": ref_s, "inputs_s": inputs_s} | ref  # every row of the case carries them
    extra = built_ahead[1] if built_ahead is not None else {}
    return _Built(pristine, expected, twin, shared, flops, nbytes, rule_for(case), cache, extra)


def _run_backend(
    case: Case, b: Backend, built: _Built, opts: RunOptions, env: dict, memo: dict, rows: dict
) -> tuple[Result, Callable | None]:
    """One backend's row: a copy of the inputs, `prepare`, the checked call, then the checks of
    `opts.checks` in order (harness/check/checklist.py). Returns the row and the closure to time (None when
    it did not run to a verdict). Any exception is this row's error (ContextLost when it broke the
    CUDA context, carrying the rows so far)."""
    op, p, shared = case.op, case.params, built.shared
    try:
        t0 = time.perf_counter()
        work = clone_tensors(built.pristine)
        copy_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        fn = b.prepare(case, work)
        _sync(case)
        prep = time.perf_counter() - t0
        t0 = time.perf_counter()
        outputs = call_untimed(fn, around=_profiled(case, b.name))
        _sync(case)
        call_s = copy_s + time.perf_counter() - t0
        call = PreparedCall(case, b, built.pristine, work, fn)
        absent = call.absent
        if broken := outputs_contract(op, p, outputs, absent):
            return _row(case, b.name, "error", broken, prepare_s=prep, call_s=call_s, env=env, **shared), None
        ctx = CheckContext(call, outputs, built.expected, built.twin, built.rule, opts, memo=memo,
                           ref_cache=built.ref_cache)  # fmt: skip
        parts, fields = _apply_checks(ctx, opts.checks if opts.checks is not None else active())
        verdict = ctx.verdict
        failed = subjects(verdict.problems, op.checked_names(p))
        row = _row(
            case, b.name, "pass" if verdict.ok else "fail", verdict.reason, prepare_s=prep, call_s=call_s,
            check_s=sum(parts.values()), check_parts=parts, prepare_info=_info(call), env=env,
            failed=failed, **shared, **fields,
        )  # fmt: skip
        return row, fn
    except Unsupported as e:
        return _row(case, b.name, "skip", str(e), env=env), None
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # also SystemExit (a library's sys.exit): this row's error, not the sweep's end
        reason = describe(e)
        if out_of_memory(e):
            reason += f" ({_held(built, memo)})"
        row = _row(case, b.name, "error", reason, env=env, **shared)
        if context_lost(e):
            raise ContextLost([*(rows[n] for n in rows), row], f"{b.name}: {e}") from e
        if case.on_cuda:
            torch.cuda.empty_cache()
        return row, None


# Inputs from this size on (suites/large.yaml: 8 GiB pools) are collected after every check: a copy
# that sits in a reference cycle until the next automatic collection is another pool on the device
# (H100, `large` extend: 7 copies of 8.3 GiB alive at once before this).
COLLECT_FROM_BYTES = 2**30


def _apply_checks(ctx: CheckContext, checks) -> tuple[dict[str, float], dict]:
    """Each check that applies, in order: its seconds (`check_parts`) and the row fields it records."""
    parts: dict[str, float] = {}
    fields: dict = {}
    big = storage_bytes(ctx.prepared.pristine) >= COLLECT_FROM_BYTES
    for c in checks:
        if not runnable(c, ctx):
            continue
        with spent(parts, c.name):
            got = c.run(ctx) or {}
            if big:  # copies a check made (fresh closures, perturbed pools) may sit in reference cycles
                gc.collect()
        if stray := set(got) - set(c.records):
            raise TypeError(f"check {c.name!r} returned {sorted(stray)}, which it does not declare in `records`")
        fields |= got
    return parts, fields


def _time(case: Case, todo: list[Backend], built: _Built, closures: dict, rows: dict, opts: RunOptions, stage) -> None:
    """Time the closures that ran, interleaved (when timing is on), and add FLOPs, bytes and the
    roofline to their rows. When that shared timing raises, no one row is to blame yet: `_after_shared`
    gives each backend its own verdict (or raises ContextLost)."""
    flops, nbytes = built.flops, built.nbytes
    if not (opts.timing and closures):
        for name in closures:
            rows[name].derived = {"flops": flops, "bytes": nbytes} | roofline(flops, nbytes, 0.0, None, case.dtype)
        return
    stage("timing")
    _wait_for_reads(rows)
    # graph mode rotates over closures prepared on fresh copies of the inputs
    by_name = {b.name: b for b in todo}
    factories = {n: (lambda b=by_name[n]: b.prepare(case, clone_tensors(built.pristine))) for n in closures}

    def timer(names: list[str]) -> dict[str, TimingStats]:
        rotation = Rotation({n: factories[n] for n in names}, nbytes, storage_bytes(built.pristine))
        return time_closures({n: closures[n] for n in names}, case.device, opts.timing_config, rotation)

    def record(name: str, st: TimingStats) -> None:
        secs = st.median_us * 1e-6
        rows[name].timing = st.to_dict()
        rows[name].derived = {
            "flops": flops,
            "bytes": nbytes,
            "tflops": flops / secs / 1e12 if secs > 0 else 0.0,
            "tbps": nbytes / secs / 1e12 if secs > 0 else 0.0,
        } | roofline(flops, nbytes, secs, opts.peaks, case.dtype)

    try:
        stats = timer(list(closures))
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        _after_shared(list(closures), timer, record, rows, e, stage)
        return
    for name, st in stats.items():
        record(name, st)


def _after_shared(names: list[str], timer, record, rows: dict, e: BaseException, stage) -> None:
    """After the timing of `names` together (`timer(names)`) raised `e`: each row its own verdict.

    One closure: `e` is its row's error ("timing failed: ..."). Several, and `e` lost the CUDA context:
    nothing more can run in this process and the culprit is unknown: ContextLost with every one of them
    `alone` (their rows say so), for a supervisor to run each in a fresh process. Several, the context
    intact: each timed again on its own (`stage(name)` first, so that a crash there is its own); one
    that times fine is `record`ed, its stats noted; one that raises again gets "timing failed: ...";
    one that loses the context is the culprit: ContextLost with the closures not yet timed `alone`."""
    why = describe(e)
    if len(names) == 1:
        rows[names[0]].status, rows[names[0]].reason = "error", f"timing failed: {why}"
        if context_lost(e):
            raise ContextLost(list(rows.values()), f"timing: {e}") from e
        return
    if context_lost(e):
        lost = f"the CUDA context was lost; which backend broke it is unknown: {why}"
        for n in names:
            rows[n].status = "error"
            rows[n].reason = f"timing failed while timed together with {_others(names, n)} ({lost})"
        raise ContextLost(list(rows.values()), f"timing of {len(names)} backends together: {e}", tuple(names)) from e
    for i, n in enumerate(names):
        stage(n)
        try:
            st = timer([n])[n]
        except KeyboardInterrupt:
            raise
        except BaseException as solo:
            rows[n].status, rows[n].reason = "error", f"timing failed: {describe(solo)}"
            if context_lost(solo):
                for m in names[i + 1 :]:
                    rows[m].status, rows[m].reason = "error", f"not timed: the CUDA context was lost timing {n} alone"
                raise ContextLost(list(rows.values()), f"{n}: timing: {solo}", tuple(names[i + 1 :])) from solo
            continue
        alone = f"timed alone: timed together with {_others(names, n)} it failed ({why})"
        st.note = "; ".join(filter(None, (alone, st.note)))
        record(n, st)


def _others(names: list[str], name: str) -> str:
    return ", ".join(m for m in names if m != name)


def _wait_for_reads(rows: dict) -> None:
    """Before the timing: wait until nothing is read or built ahead for the next case (no host work
    beside the timed windows); the seconds waited count as reading references (each row's
    `reference_s`) and as building inputs (`inputs_s`)."""
    from attnbench.store import refcache

    read, built = refcache.wait_reads(), inputs_ahead.wait()
    for r in rows.values():
        if r.reference_s is not None:
            r.reference_s += read
        if r.inputs_s is not None:
            r.inputs_s += built


def _reference(case: Case, pristine, cache) -> tuple[dict, dict, dict]:
    """The float64 expectation and the native-precision twin of `case`, from the reference cache `cache`
    (harness/store/refcache.py; None: off) when it holds them, else computed (and stored there). The third
    value is what the rows record: `reference_from` ("cache" | "computed") and `reference_note` (a cache
    problem)."""
    op, p = case.op, case.params
    note = ""
    if cache is not None:
        hit, note = cache.get(case, pristine)
        if hit is not None:
            return *hit, {"reference_from": "cache"}
    expected = op.expected(p, pristine, torch.float64)
    twin = op.expected(p, pristine, case.torch_dtype)
    _sync(case)
    if cache is not None:
        stored = cache.put(case, expected, twin, pristine)
        note = "; ".join(filter(None, (note, stored)))
    return expected, twin, {"reference_from": "computed"} | ({"reference_note": note} if note else {})


def nvtx_range(backend: str) -> str:
    """The NVTX range a backend's checked call runs in: `attnbench:` and its name with every character
    outside letters, digits, `_`, `.` and `-` as `_` (`triton[gdn_stream=128]` -> `attnbench:triton_gdn_stream_128_`),
    so an `ncu --nvtx-include` filter takes it literally."""
    return "attnbench:" + "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "_" for c in backend)


@contextlib.contextmanager
def _profiled(case: Case, backend: str):
    """The checked call of each row (not its finalize) inside the NVTX range `nvtx_range(backend)` (GPU cases), so a
    profiler can keep exactly one call of one backend's kernels: `ncu --nvtx --nvtx-include
    "attnbench:triton/"` (tools/bench/ncu_rows.sh). Costs a few microseconds outside any window."""
    if not case.on_cuda:
        yield
        return
    torch.cuda.nvtx.range_push(nvtx_range(backend))
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


def _info(call: PreparedCall) -> dict:
    """The row's prepare_info: the closure's `info`, plus the outputs its kernel does not produce
    (`absent`) and the inputs it consumed in prepare (`planned`), as the prepared call reads them."""
    absent, planned = call.absent, call.planned
    return (
        dict(getattr(call.fn, "info", {}) or {})
        | ({"absent": absent} if absent else {})
        | ({"planned": planned} if planned else {})
    )
