"""Run cases: reference once per case, then every backend prepared, checked and timed the same way.

For one case: backends that do not support it become `skip` rows; the inputs are built once and the
float64 reference and the native-precision twin computed once; each backend gets its own clone of the
inputs, `prepare` (timed apart, by host clock), one checked call, one stale-output call on perturbed
inputs; then the closures of all backends that ran are timed together, interleaved. Any exception
becomes an `error` row for that backend only.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.backend import Backend
from attnbench.buffers import bitwise_equal, clone_tensors
from attnbench.case import Case
from attnbench.checks import DETERMINISM_REPEATS, Verdict, check, outputs_changed, outputs_contract, stale_check
from attnbench.errors import Unsupported, describe, out_of_memory
from attnbench.expectations import subjects
from attnbench.peaks import roofline
from attnbench.results import Result
from attnbench.timing import Rotation, TimingConfig, time_closures
from attnbench.tolerance import rule_for


@dataclass(frozen=True)
class RunOptions:
    timing: bool = True
    timing_config: TimingConfig | None = None
    invariance: bool = False  # check batch invariance for every case (else only where a suite requires it)
    peaks: dict | None = None  # attnbench.peaks.get_peaks() of the device: adds the roofline to `derived`
    # calls after the checked one that must reproduce its bits (harness/checks.py says why 5); fewer only
    # where the execution cannot vary between calls (tests of kernels under the Triton interpreter)
    determinism_repeats: int = DETERMINISM_REPEATS
    ref_cache: str | None = None  # reference cache directory (harness/refcache.py); None: off
    ref_cache_max: int | None = None  # its cap in bytes; None: refcache.default_max_bytes()


class ContextLost(Exception):
    """A backend broke the CUDA context (illegal address, device assert): nothing more can run here.

    Carries the rows finished so far (the culprit's error row included); the process must end.
    """

    def __init__(self, rows: list[Result], reason: str):
        super().__init__(reason)
        self.rows, self.reason = rows, reason


_STICKY = ("illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
           "illegal instruction", "an illegal", "CUDA error: unknown error", "uncorrectable ECC")  # fmt: skip


def context_lost(e: BaseException) -> bool:
    """True for the CUDA errors after which the context is unusable."""
    return isinstance(e, RuntimeError) and any(s in str(e) for s in _STICKY)


def _nbytes(inputs) -> int:
    from attnbench.buffers import all_tensors

    seen, total = set(), 0
    for t in all_tensors(inputs):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _sync(case: Case) -> None:
    if case.on_cuda:
        torch.cuda.synchronize(torch.device(case.device))


def call_untimed(fn: Callable) -> dict:
    """One call of a closure outside the timed window, then its `finalize` (harness/backend.py), if any:
    the outputs and written inputs in the canonical layout, as the checks read them."""
    outputs = fn()
    finalize = getattr(fn, "finalize", None)
    return finalize(outputs) if finalize is not None else outputs


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
) -> list[Result]:
    """All rows of one case, in backend order.

    `on_stage(name)` is told which backend is about to run (`"timing"` for the shared timing phase,
    `"reference"` before inputs and references) so a supervisor can attribute a crash or a timeout.
    Raises ContextLost when a backend broke the CUDA context. Runs with the case's GPU as the current
    device (kernels that launch on the current device, like Triton's, then find their tensors).
    """
    t0 = time.perf_counter()
    with torch.cuda.device(torch.device(case.device)) if case.on_cuda else contextlib.nullcontext():
        rows = _run_case(case, backends, opts, env, on_stage)
    case_s = time.perf_counter() - t0
    for r in rows:
        r.case_s = case_s
    return rows


def _run_case(case, backends, opts, env, on_stage) -> list[Result]:
    env = env or {}
    stage = on_stage or (lambda name: None)
    rows, todo = triage(case, backends, env)
    if not todo:
        return [rows[b.name] for b in backends]

    op, p = case.op, case.params
    pristine = None
    try:
        stage("reference")
        t0 = time.perf_counter()
        pristine = case.make_inputs()
        _sync(case)
        inputs_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        expected, twin, ref = _reference(case, pristine, opts)
        ref_s = time.perf_counter() - t0
        flops, nbytes = op.flops(p, pristine), op.bytes(p, pristine)
    except Exception as e:
        size = f" (inputs {_nbytes(pristine) / 2**30:.2f} GiB)" if pristine is not None else ""
        for b in todo:
            rows[b.name] = _row(
                case, b.name, "error", f"building inputs/reference failed: {describe(e)}{size}", env=env
            )
        if context_lost(e):
            raise ContextLost([rows[b.name] for b in backends if b.name in rows], str(e)) from e
        return [rows[b.name] for b in backends]
    shared = {"reference_s": ref_s, "inputs_s": inputs_s} | ref  # every row of the case carries them

    rule = rule_for(case)
    closures: dict[str, Callable] = {}
    stale_memo: dict = {}  # the perturbed inputs' expectations, shared by the backends of the case
    for b in todo:
        stage(b.name)
        try:
            t0 = time.perf_counter()
            work = clone_tensors(pristine)
            copy_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            fn = b.prepare(case, work)
            _sync(case)
            prep = time.perf_counter() - t0
            t0 = time.perf_counter()
            outputs = call_untimed(fn)
            _sync(case)
            call_s = copy_s + time.perf_counter() - t0
            absent = dict(getattr(fn, "absent", {}) or {})
            if broken := outputs_contract(op, p, outputs, absent):
                rows[b.name] = _row(case, b.name, "error", broken, prepare_s=prep, call_s=call_s, env=env, **shared)
                continue
            parts: dict[str, float] = {}
            with _timed(parts, "outputs"):
                verdict = check(op, p, pristine, work, outputs, expected, twin, rule, absent=absent)
            determinism = {}
            if not verdict.malformed:
                determinism = _determinism(case, b, fn, pristine, outputs, verdict, opts, parts)
                again = functools.partial(call_untimed, fn)
                with _timed(parts, "stale"):
                    stale_check(
                        op, p, pristine, again, work, verdict, lambda: _sync(case), rule, case.torch_dtype, absent,
                        stale_memo,
                    )  # fmt: skip
            status = "pass" if verdict.ok else "fail"
            failed = subjects(verdict.problems, [*op.outputs_for(p), *op.writes_for(p)])
            rows[b.name] = _row(
                case, b.name, status, verdict.reason, metrics=verdict.metrics, prepare_s=prep, call_s=call_s,
                check_s=sum(parts.values()), check_parts=parts, prepare_info=_info(fn, absent), env=env,
                failed=failed, **shared, **determinism,
            )  # fmt: skip
            # without timing nothing calls it again: drop it, so its copy of the inputs (a production-size pool
            # of gigabytes, suites/large.yaml) is freed before the next backend's is made
            closures[b.name] = fn if opts.timing else None
        except Unsupported as e:
            rows[b.name] = _row(case, b.name, "skip", str(e), env=env)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # also SystemExit (a library's sys.exit): this row's error, not the sweep's end
            reason = describe(e)
            if out_of_memory(e):
                reason += f" (case inputs {_nbytes(pristine) / 2**30:.2f} GiB, cloned once per backend)"
            rows[b.name] = _row(case, b.name, "error", reason, env=env, **shared)
            if context_lost(e):
                raise ContextLost([rows[n] for n in rows], f"{b.name}: {e}") from e
            if case.on_cuda:
                torch.cuda.empty_cache()
    if opts.timing and closures:
        stage("timing")
        # graph mode rotates over closures prepared on fresh copies of the inputs
        by_name = {b.name: b for b in todo}
        factories = {n: (lambda b=by_name[n]: b.prepare(case, clone_tensors(pristine))) for n in closures}
        try:
            stats = time_closures(closures, case.device, opts.timing_config, Rotation(factories, nbytes))
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            for name in closures:
                rows[name].status, rows[name].reason = "error", f"timing failed: {describe(e)}"
            if context_lost(e):
                raise ContextLost([rows[n] for n in rows], f"timing: {e}") from e
            stats = {}
        for name, st in stats.items():
            secs = st.median_us * 1e-6
            rows[name].timing = st.to_dict()
            rows[name].derived = {
                "flops": flops,
                "bytes": nbytes,
                "tflops": flops / secs / 1e12 if secs > 0 else 0.0,
                "tbps": nbytes / secs / 1e12 if secs > 0 else 0.0,
            } | roofline(flops, nbytes, secs, opts.peaks, case.dtype)
    else:
        for name in closures:
            rows[name].derived = {"flops": flops, "bytes": nbytes} | roofline(flops, nbytes, 0.0, None, case.dtype)
    return [rows[b.name] for b in backends]


def _reference(case: Case, pristine, opts: RunOptions) -> tuple[dict, dict, dict]:
    """The float64 expectation and the native-precision twin of `case`, from the reference cache when
    it holds them (harness/refcache.py), else computed (and stored there). The third value is what the
    rows record: `reference_from` ("cache" | "computed") and `reference_note` (a cache problem)."""
    from attnbench import refcache

    op, p = case.op, case.params
    cache = refcache.open_cache(opts.ref_cache, opts.ref_cache_max)
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


@contextlib.contextmanager
def _timed(parts: dict[str, float], name: str):
    """Add the seconds the block takes to `parts[name]` (a row's `check_parts`)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        parts[name] = parts.get(name, 0.0) + time.perf_counter() - t0


def _info(fn: Callable, absent: dict[str, str]) -> dict:
    """The row's prepare_info: the closure's `info`, plus the outputs its kernel does not produce."""
    return dict(getattr(fn, "info", {}) or {}) | ({"absent": absent} if absent else {})


def _determinism(
    case: Case, b: Backend, fn: Callable, pristine, outputs: dict, verdict: Verdict, opts, parts: dict[str, float]
) -> dict:
    """Run-to-run determinism (always: `opts.determinism_repeats` more calls, see harness/checks.py) and batch
    invariance (when asked); required ones, and determinism a backend declares, fail the row. Their seconds
    go to `parts` ("determinism", "invariance")."""
    t0 = time.perf_counter()
    first = {k: v.clone() for k, v in outputs.items()}
    same = True
    for _ in range(opts.determinism_repeats):
        if case.op.writes_for(case.params):  # the call moved its inputs on (states, caches): again from pristine
            again = call_untimed(b.prepare(case, clone_tensors(pristine)))
        else:
            again = call_untimed(fn)
        _sync(case)
        if outputs_changed(first, again):
            same = False
            break
    parts["determinism"] = time.perf_counter() - t0
    out = {"deterministic": same}
    promised = "deterministic" in case.require or getattr(b, "deterministic", False) is True
    if not same and promised:
        why = "required here" if "deterministic" in case.require else f"{b.name} declares itself deterministic"
        verdict.problems.append(f"not deterministic ({why}): calls on the same inputs gave different bits")
    if opts.invariance or case.invariance or "batch_invariant" in case.require:
        with _timed(parts, "invariance"):
            out["batch_invariant"] = _batch_invariant(case, b, pristine, first)
        if out["batch_invariant"] is False and "batch_invariant" in case.require:
            verdict.problems.append("not batch invariant: a request's output changed with the batch around it")
    return out


def _batch_invariant(case: Case, b: Backend, pristine, reference: dict) -> bool | None:
    """Request 0 alone, and the whole batch reversed, must reproduce the batch's outputs bit for bit."""
    op, p = case.op, case.params
    n = len(pristine.seq_lens_host) if hasattr(pristine, "seq_lens_host") else None
    n = n if n is not None else next(iter(reference.values())).shape[0]
    for order in ([0], list(range(n))[::-1]) if n > 1 else ([0],):
        sub = op.subset(p, pristine, order)
        if sub is None:
            return None
        inputs, rows = sub
        got = call_untimed(b.prepare(case, clone_tensors(inputs)))
        _sync(case)
        for k, ref_out in reference.items():
            if not bool(bitwise_equal(got[k], ref_out[rows]).all()):
                return False
    return True
