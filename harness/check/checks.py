"""Checks: compare a backend's outputs and side effects with the float64 expectation.

Per numeric output: max abs, max rel, relative L2, cosine, mismatch fraction (share of elements over
the bound), where the worst element is, and the bound of the tolerance rule. Besides error size, a
check catches NaN/Inf, writes outside an output (canary padding), changed inputs, cache slots
written that should not be or not written (bitwise, also in numerically compared writes such as
state pools), and wrong shapes or dtypes. Output elements an op declares unspecified
(`Op.unspecified`, e.g. rows of padding requests) are not compared. `stale_check` (outputs must
follow when every input the op reads changes in place, `Op.perturbations`) is called by the runner,
which owns the closure. `outputs_contract` turns a closure that
returns something other than the op's outputs into one line naming the contract.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnbench.buffers import (
    all_tensors,
    bitwise_equal,
    canary_intact,
    clone_tensors,
    count_true,
    cuda_available_bytes,
    storage_bytes,
    tensor_fields,
)
from attnbench.check.tolerance import Rule
from attnbench.ops.base import OutputSpec, magnitude_key

# Calls after the checked one that must reproduce its bits (the runner's determinism check; it stops
# at the first difference). A kernel that picks its reduction order at random among k orders, on
# inputs where two orders give different bits, goes unseen with probability (1/k)^5: at most 1/32
# (3.1%, k = 2), under 0.1% for k >= 4. docs/conventions.md "Determinism" says why the inputs qualify.
DETERMINISM_REPEATS = 5


class Problem(str):
    """A verdict problem (its text) that also names what it is about, where the text's head cannot:
    the replay check re-checks the outputs on another batch, and its one problem is about
    `replay:<output>` for each output that failed there (`subjects`)."""

    subjects: tuple[str, ...] = ()

    def __new__(cls, text: str, subjects=()):
        p = super().__new__(cls, text)
        p.subjects = tuple(subjects)
        return p


def subjects(problems: list[str], names: Iterable[str]) -> list[str]:
    """What each problem of a check verdict is about: an output's or written input's name for the
    problems that start with `name:` (error size, NaN/Inf, canary, shape), else the problem itself
    (missing outputs, modified inputs, staleness, determinism), which no `outputs:` list can name."""
    names = set(names)
    out = []
    for p in problems:
        if named := getattr(p, "subjects", ()):  # Problem: `replay:<output>`
            out.extend(named)
            continue
        head = p.split(":", 1)[0]
        out.append(head if head in names else p)
    return sorted(set(out))


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)
    # an output of the wrong shape, dtype or device: its values cannot be compared, so the checks
    # that call the closure again (determinism, staleness) do not run either
    malformed: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def reason(self) -> str:
        if len(self.problems) <= 3:
            return "; ".join(self.problems)
        return "; ".join(self.problems[:3]) + f"; and {len(self.problems) - 3} more"


def _where(index: int, shape: tuple[int, ...], dims: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for size, name in zip(reversed(shape), reversed(dims)):
        out[name] = index % size
        index //= size
    return dict(reversed(list(out.items())))


def _fmt_where(w: dict[str, int]) -> str:
    return " ".join(f"{k} {v}" for k, v in w.items())


def slice_index(shape: tuple[int, ...], dims: tuple[str, ...], rows: torch.Tensor | None, device) -> tuple:
    """(slice id of every element `[*shape]` int64, number of slices): one slice per (request, head).

    `rows [shape[0]]` gives the request of each row of the first dim; the `head` dim, where there is
    one, splits each request's rows by head. `rows` None (an op without requests, e.g. the elementwise
    gdn_gating, where a slice could be a single element and the twin's error a single sample): one
    slice, the whole tensor.
    """
    if rows is None:
        return torch.zeros(shape, dtype=torch.long, device=device), 1
    g = rows.to(device).long()
    count = int(g.max()) + 1 if g.numel() else 1
    idx = g.view(-1, *([1] * (len(shape) - 1)))
    if "head" in dims and dims.index("head") > 0:
        h = dims.index("head")
        heads = torch.arange(shape[h], device=device).view([1] * h + [shape[h]] + [1] * (len(shape) - h - 1))
        idx, count = idx * shape[h] + heads, count * shape[h]
    return idx.expand(shape), count


def _slice_max(values: torch.Tensor, idx: torch.Tensor, count: int) -> torch.Tensor:
    """Max of non-negative `values` per slice id (0 for an empty slice)."""
    out = torch.zeros(count, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, idx.flatten(), values.flatten(), "amax", include_self=True)


@dataclass
class ReferenceSide:
    """What comparing an output with its float64 reference takes from the reference, the twin and the
    case alone (no backend's output enters): the slices, their bounds and the per-tensor figures.
    `check` keeps it in its `memo` for the case's next backend (`reference_side`)."""

    r: torch.Tensor  # the reference, float64
    finite: torch.Tensor  # where it is finite
    any_nonfinite: bool
    fr: torch.Tensor  # r, 0 where not finite
    fr_norm: float
    scale_t: float
    metrics: dict[str, Any]  # bound, twin_max_abs, scale, bound_tensor, magnitude (per tensor)
    idx: torch.Tensor | None = None  # slice id of every element (None: an empty tensor)
    count: int = 0
    bound_s: torch.Tensor | None = None
    bound_e: torch.Tensor | None = None  # bound_s of each element's slice
    twin_s: torch.Tensor | None = None
    scale_s: torch.Tensor | None = None
    mag_s: torch.Tensor | None = None


def reference_side(
    ref: torch.Tensor,
    twin: torch.Tensor,
    spec: OutputSpec,
    rule: Rule,
    dtype: torch.dtype,
    units: float = 0.0,
    rows: torch.Tensor | None = None,
    magnitude: torch.Tensor | None = None,
) -> ReferenceSide:
    """The `ReferenceSide` of an output of `dtype` (compare_numeric's docstring says how bounds are made)."""
    r, t = ref.double(), twin.double()
    finite = torch.isfinite(r)
    any_nonfinite = bool((~finite).any())
    size = torch.where(finite, r.abs(), 0.0)
    mag = None if magnitude is None else torch.where(finite, torch.maximum(size, magnitude.double()), 0.0)
    scale_t = float(size.max()) if r.numel() else 0.0
    scale_t = scale_t if scale_t > 0 else 1.0
    mag_t = None if mag is None else max(float(mag.max()), scale_t)
    twin_abs = torch.where(finite, (t - r).abs(), 0.0)
    twin_t = float(twin_abs.max()) if r.numel() else 0.0
    bound_t = rule.bound(twin_t, dtype, scale_t, units, mag_t)
    m: dict[str, Any] = {"bound": bound_t, "twin_max_abs": twin_t, "scale": scale_t, "bound_tensor": bound_t}
    if mag_t is not None:
        m["magnitude"] = mag_t
    fr = torch.where(finite, r, 0.0) if any_nonfinite else r
    side = ReferenceSide(r, finite, any_nonfinite, fr, float(fr.norm()), scale_t, m)
    if not r.numel():
        return side
    idx, count = slice_index(tuple(r.shape), spec.dims, rows, r.device)
    twin_s = _slice_max(twin_abs, idx, count)
    scale_s = _slice_max(size, idx, count)
    scale_s = torch.where(scale_s > 0, scale_s, torch.full_like(scale_s, scale_t))
    if not spec.slice_scale:
        scale_s = torch.full_like(scale_s, scale_t)
    mag_s = None if mag is None else torch.maximum(_slice_max(mag, idx, count), scale_s)
    # A slice's twin error is a small sample: it may not reach the half ulp a faithful kernel's output
    # rounding can take the other way, so a slice's floor is one ulp (2 u) of its scale; capped by the
    # per-tensor bound, so no slice is ever looser than the tensor
    bound_s = rule.bound(twin_s, dtype, scale_s, units, mag_s, ulps=2).clamp(max=bound_t)
    side.idx, side.count, side.bound_s, side.bound_e = idx, count, bound_s, bound_s[idx]
    side.twin_s, side.scale_s, side.mag_s = twin_s, scale_s, mag_s
    return side


def compare_numeric(
    name: str,
    actual: torch.Tensor,
    ref: torch.Tensor,
    twin: torch.Tensor,
    spec: OutputSpec,
    rule: Rule,
    v: Verdict,
    units: float = 0.0,
    rows: torch.Tensor | None = None,
    magnitude: torch.Tensor | None = None,
    side: ReferenceSide | None = None,
) -> None:
    """Error metrics of `actual` against `ref` (float64) and the pass/fail bound from `twin`, per slice.

    The tolerance rule is applied per (request, head) slice (`slice_index`; `rows` maps the first dim
    to requests): each slice's bound comes from the twin's error and the reference's scale in that
    slice (floor: one ulp, 2 u, of the slice's scale), so a short request's loose bound never covers a
    long request's error. Each slice's bound is capped by the per-tensor bound
    (`bound_tensor` in the metrics, for comparison). The worst slice (largest error / bound) is reported.
    `magnitude` (same shape, `OutputSpec.magnitude`): the size of each element's summands; the floor
    scales with it in place of |ref| (it is >= |ref|, and equal where nothing cancels).
    `side`: `reference_side` of these arguments, computed once for the case's backends (else here).
    """
    if side is None:
        side = reference_side(ref, twin, spec, rule, actual.dtype, units, rows, magnitude)
    r, finite, scale_t = side.r, side.finite, side.scale_t
    a = actual.double()
    nonfinite_ok = bool(torch.equal(a[~finite], r[~finite])) if side.any_nonfinite else True
    bad = ~torch.isfinite(a) & finite
    err = torch.where(finite, (a - r).abs(), 0.0)
    err = torch.where(bad, math.inf, err)
    m: dict[str, Any] = dict(side.metrics)
    if r.numel():
        idx, bound_e = side.idx, side.bound_e
        ratio = err / bound_e
        worst = int(ratio.flatten().argmax()) if bool((err > bound_e).any()) else int(err.flatten().argmax())
        ws = int(idx.flatten()[worst])
        m["bound"], m["twin_max_abs"], m["scale"] = (
            float(side.bound_s[ws]),
            float(side.twin_s[ws]),
            float(side.scale_s[ws]),
        )
        if side.mag_s is not None:
            m["magnitude"] = float(side.mag_s[ws])
        m["slices"] = side.count
        fa, fr = torch.where(finite & ~bad, a, 0.0), side.fr
        m["max_abs"] = float(err.max())
        m["max_rel"] = float((err / torch.clamp(r.abs(), min=1e-3 * scale_t)).max())
        m["rel_l2"] = float((fa - fr).norm() / max(side.fr_norm, 1e-300))
        m["cos"] = float((fa * fr).sum() / max(float(fa.norm()) * side.fr_norm, 1e-300))
        m["mismatch"] = float((err > bound_e).double().mean())
        m["worst"] = _where(worst, tuple(actual.shape), spec.dims)
        m["worst_abs"] = float(err.flatten()[worst])
        m["nonfinite"] = count_true(bad)
        over = m["mismatch"] > 0
    else:
        over = False
    v.metrics[name] = m
    if over and "head" in spec.dims and spec.dims.index("head") > 0:
        m["heat"] = _heat(err, spec.dims)
    if bad.any():
        v.problems.append(_nonfinite_problem(name, a, bad, actual.shape, spec.dims))
    elif not nonfinite_ok:
        v.problems.append(f"{name}: wrong where the reference is ±inf (e.g. an empty row's LSE must be -inf)")
    elif over:
        v.problems.append(
            f"{name}: abs error {m['worst_abs']:.3g} > bound {m['bound']:.3g} of its request/head slice "
            f"({_describe_bound(rule, m, actual.dtype, units)}) at {_fmt_where(m['worst'])}; "
            f"{100 * m['mismatch']:.3g}% of elements over"
        )


def _describe_bound(rule: Rule, m: dict[str, Any], dtype: torch.dtype, units: float) -> str:
    """How the worst slice's bound is made up; "capped" when the per-tensor bound is the tighter one."""
    if m["bound"] >= m["bound_tensor"] and m.get("slices", 1) > 1:
        return f"capped by the tensor's bound {m['bound_tensor']:.2e}"
    return rule.describe(m["twin_max_abs"], dtype, m["scale"], units, m.get("magnitude"), ulps=2)


_MINUS_INF_WHY = {"lse": "no visible key seen where the reference has one, or the sink ignored?"}


def _nonfinite_problem(name: str, a: torch.Tensor, bad: torch.Tensor, shape, dims) -> str:
    """One line per kind of non-finite value where the reference is finite, each with its likely cause.

    -inf is what an LSE becomes when a kernel saw no visible key (or dropped the sink on a row whose
    only mass is the sink); NaN is an unwritten output (the harness NaN-fills them), 0/0, or a read of a
    poisoned KV slot; +inf an overflow.
    """
    kinds = (
        (a.isnan(), "NaN", "unwritten output, 0/0, or a read of poisoned KV slots?"),
        (a == -math.inf, "-inf", _MINUS_INF_WHY.get(name, "an overflow: exp or log of a value out of range?")),
        (a == math.inf, "+inf", "overflow: an unstabilised exp or a missing max subtraction?"),
    )
    parts = []
    for mask, what, why in kinds:
        m = mask & bad
        if m.any():
            first = _where(int(m.flatten().nonzero()[0]), tuple(shape), dims)
            parts.append(f"{count_true(m)} {what} where the reference is finite, first at {_fmt_where(first)} ({why})")
    return f"{name}: " + "; ".join(parts)


def _heat(err: torch.Tensor, dims: tuple[str, ...], bins: int = 64) -> list[list[float]]:
    """Max error per (head, row bin): rows = the first dim, pooled to at most `bins` bins."""
    h = dims.index("head")
    rest = [d for d in range(err.dim()) if d not in (0, h)]
    e = err.amax(dim=rest) if rest else err  # [rows, heads]
    e = e.transpose(0, 1).float()
    rows = e.shape[1]
    if rows > bins:
        pad = (-rows) % bins
        e = torch.nn.functional.pad(e, (0, pad)).view(e.shape[0], bins, -1).amax(-1)
    e = torch.where(torch.isfinite(e), e, torch.full_like(e, float("nan")))
    return [[round(float(x), 6) for x in row] for row in e.cpu()]


def compare_exact(name: str, actual: torch.Tensor, expected: torch.Tensor, before: torch.Tensor, v: Verdict) -> None:
    """Bitwise comparison of a written input (cache slots), telling unwritten from wrongly written."""
    same = bitwise_equal(actual, expected)
    v.metrics[name] = {"exact": True, "wrong": count_true(~same)}
    if same.all():
        return
    should_change = ~bitwise_equal(before, expected)
    missing = count_true(~same & should_change)
    stray = count_true(~same & ~should_change)
    parts = []
    if missing:
        parts.append(f"{missing} elements not written as expected")
    if stray:
        parts.append(f"{stray} elements written that should be untouched")
    v.problems.append(f"{name}: " + ", ".join(parts))


def _written_side(ref, twin, spec, rule, dtype, units, rows, before) -> tuple[ReferenceSide, torch.Tensor]:
    """A numerically compared written input's `reference_side` and `untouched_mask`."""
    return reference_side(ref, twin, spec, rule, dtype, units, rows), untouched_mask(ref, before)


def untouched_mask(expected: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """Where a numerically compared write must leave the input as it was: the expectation equals the
    value before the call exactly (NaN where both are)."""
    e, b = expected.double(), before.double()
    return (e == b) | (e.isnan() & b.isnan())


def compare_untouched(
    name: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    before: torch.Tensor,
    v: Verdict,
    keep: torch.Tensor | None = None,
) -> None:
    """The part of a numerically compared write that must stay as it was.

    Where the expectation equals the value before the call exactly (e.g. pool slots that no request
    addresses), every bit must be unchanged. `keep`: `untouched_mask(expected, before)`, if computed.
    """
    keep = untouched_mask(expected, before) if keep is None else keep
    stray = count_true(keep & ~bitwise_equal(actual, before))
    v.metrics.setdefault(name, {})["untouched_changed"] = stray
    if stray:
        v.problems.append(f"{name}: {stray} elements written that should be untouched")


def compare_spare(name: str, actual: torch.Tensor, before: torch.Tensor, v: Verdict) -> None:
    """The rows of a written pool before the region its requests use (`Op.written_rows`): bitwise unchanged."""
    stray = count_true(~bitwise_equal(actual, before))
    v.metrics.setdefault(name, {})["spare_changed"] = stray
    if stray:
        v.problems.append(f"{name}: {stray} elements written in the pool's spare rows before the requests' region")


def _fill_unspecified(t: torch.Tensor, mask: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    """`t` with the elements the contract leaves open replaced by `value` (so they cannot fail a check)."""
    if mask is None:
        return t
    return torch.where(mask.to(t.device), value.to(t.dtype), t)


def _rows(spec: OutputSpec, requests: torch.Tensor | None, t: torch.Tensor) -> torch.Tensor | None:
    """Request of each row of an output: `requests` for token rows; a slot or request dim is its own."""
    if spec.dims[0] == "token":
        return requests
    if spec.dims[0] in ("slot", "request"):
        return torch.arange(t.shape[0])
    return None


def _units(spec: OutputSpec, params) -> float:
    """sqrt(n): n the summed lengths of the float32 sums the output goes through (`floor_units`)."""
    names = (spec.floor_units,) if isinstance(spec.floor_units, str) else spec.floor_units or ()
    return math.sqrt(sum(getattr(params, n) for n in names)) if names else 0.0


def check(
    op,
    params,
    pristine: Any,
    work: Any,
    outputs: dict[str, torch.Tensor],
    expected: dict[str, torch.Tensor],
    twin: dict[str, torch.Tensor],
    rule: Rule,
    absent: dict[str, str] | None = None,
    memo: dict | None = None,
) -> Verdict:
    """Everything but staleness: outputs, side effects, untouched inputs, canaries.

    `absent`: outputs the backend's kernel does not produce (name -> why, the closure's `absent`);
    they are not compared (the row records them), every other output must be there.
    `memo` (one dict per case, shared by its backends): keeps what a comparison takes from the
    reference, the twin and `pristine` alone (`reference_side`, the untouched mask of a written
    input), reused by a later call with the same objects (`expected`'s and `twin`'s tensors,
    `pristine`, `rule`); the verdict and metrics are those computed without it.
    """
    v = Verdict()
    free = op.unspecified(params, pristine)
    rows = op.row_requests(params, pristine)

    def side(name, twin_of_case, dtype, make, *args):
        """`make(*args)` (a `reference_side`, with a written input's untouched mask), or the memo's for
        the same objects."""
        if memo is None:
            return make(*args)
        key, same = ("reference", name), (expected.get(name), twin_of_case, pristine, rule, dtype)
        hit = memo.get(key)
        if hit is not None and len(hit[0]) == len(same) and all(a is b for a, b in zip(hit[0], same)):
            return hit[1]
        got = make(*args)
        if _memo_bytes(got, expected.get(name)) <= REFERENCE_SIDE_MAX_BYTES:
            memo[key] = (same, got)
        return got

    for name, spec in op.outputs_for(params).items():
        if absent and name in absent:
            continue
        got = outputs.get(name)
        if got is None:
            v.problems.append(f"missing output {name!r}")
            continue
        want = getattr(pristine, name)
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype or got.device != want.device:
            on = (lambda t: f" on {t.device}") if got.device != want.device else (lambda t: "")
            v.problems.append(
                f"{name}: got {tuple(got.shape)} {got.dtype}{on(got)}, expected {tuple(want.shape)} {want.dtype}{on(want)}"
            )
            v.malformed = True
            continue
        if not canary_intact(getattr(work, name), want):
            v.problems.append(f"{name}: wrote outside the output (canary padding changed)")
        mask = free.get(name)
        if mask is not None:
            got = _fill_unspecified(got, mask, expected[name])
        if spec.exact:
            compare_exact(name, got, expected[name], want, v)
        else:
            tw = _fill_unspecified(twin[name], mask, expected[name])
            mag = expected.get(magnitude_key(name)) if spec.magnitude else None
            units, rws = _units(spec, params), _rows(spec, rows, got)
            ref_side = side(name, twin[name], got.dtype, reference_side, expected[name], tw, spec, rule, got.dtype,
                            units, rws, mag)  # fmt: skip
            compare_numeric(name, got, expected[name], tw, spec, rule, v, units, rws, mag, ref_side)
        if mask is not None:
            v.metrics[name]["unspecified"] = count_true(mask.expand_as(got))
    writes = op.writes_for(params)
    starts = op.written_rows(params, pristine)
    for name, spec in writes.items():
        start = starts.get(name, 0)  # a production-size pool: the expectation covers its end region
        got, before = getattr(work, name)[start:], getattr(pristine, name)[start:]
        if spec.exact:
            compare_exact(name, got, expected[name], before, v)
        else:
            units, rws = _units(spec, params), _rows(spec, rows, got)
            ref_side, keep = side(name, twin[name], got.dtype, _written_side, expected[name], twin[name], spec, rule,
                                  got.dtype, units, rws, before)  # fmt: skip
            compare_numeric(name, got, expected[name], twin[name], spec, rule, v, units, rws, side=ref_side)
            compare_untouched(name, got, expected[name], before, v, keep)
        if start:
            compare_spare(name, getattr(work, name)[:start], getattr(pristine, name)[:start], v)
    touched = set(op.outputs_for(params)) | set(writes)
    storages = {tensor_fields(work)[n].untyped_storage().data_ptr() for n in touched if n in tensor_fields(work)}
    for name, before in tensor_fields(pristine).items():
        after = getattr(work, name)
        if name in touched or after.untyped_storage().data_ptr() in storages:
            continue
        if not bitwise_equal(after, before).all():
            v.problems.append(f"input {name} was modified")
    return v


def outputs_contract(op, params: Any, outputs: Any, absent: dict[str, str] | None = None) -> str | None:
    """None when a closure's return value is a dict holding every output of `op` for the case with
    `params` (but those it declares `absent`); else one line saying why not."""
    names = op.outputs_for(params)
    want = ", ".join(repr(n) for n in names)
    contract = f"the closure prepare() returns must return a dict of the {op.name} outputs {{{want}}}"
    if not isinstance(outputs, dict):
        return f"{contract}; it returned {type(outputs).__name__}"
    wrong = [
        f"{n!r} is {type(outputs[n]).__name__}, not a tensor" if n in outputs else f"no {n!r}"
        for n in names
        if not isinstance(outputs.get(n), torch.Tensor) and n not in (absent or {})
    ]
    if wrong:
        got = ", ".join(repr(k) for k in outputs) or "nothing"
        return f"{contract}; it returned {{{got}}}: {'; '.join(wrong)}"
    return None


def _reset_from(dst: Any, src: Any) -> None:
    """Every tensor field of `dst` gets the bits of `src`'s, in place and padding included (the closure
    holds `dst`'s buffers); views that share storage stay views of it."""
    done = set()
    for name, t in tensor_fields(dst).items():
        key = t.untyped_storage().data_ptr()
        if key not in done:
            done.add(key)
            t.untyped_storage().copy_(getattr(src, name).untyped_storage())


def _base(op, params, pristine: Any, work: Any) -> Any:
    """The inputs a re-run starts from: the pristine ones, or for an op that writes inputs (states,
    caches) the closure's inputs as its calls left them (a backend may hold those in its own layout
    from `prepare` on, so they are never reset), with the outputs as they were before any call."""
    if not op.writes_for(params):
        return pristine  # `_perturbed` copies what it changes
    base = clone_tensors(work)
    outs = set(op.outputs_for(params))
    for name, t in tensor_fields(base).items():
        if name in outs:
            t.untyped_storage().copy_(getattr(pristine, name).untyped_storage())
    return base


REFERENCE_SIDE_MAX_BYTES = 2**30  # what `check`'s memo keeps per compared tensor for the case's next backend


def _memo_bytes(obj: Any, ref: torch.Tensor | None) -> int:
    """Bytes of the tensors `obj` holds beyond the storage of `ref` (which the case holds anyway)."""
    if isinstance(obj, ReferenceSide):
        obj = [obj.r, obj.finite, obj.fr, obj.idx, obj.bound_e]
    elif isinstance(obj, tuple):
        obj = [
            x for o in obj for x in ([o.r, o.finite, o.fr, o.idx, o.bound_e] if isinstance(o, ReferenceSide) else [o])
        ]
    seen: dict[int, int] = {}
    for t in obj:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    if ref is not None:
        seen.pop(ref.untyped_storage().data_ptr(), None)
    return sum(seen.values())


MEMO_MAX_BYTES = 256 * 2**20  # perturbed copies kept for the next backend of a case up to this size
FRESH_FIRST_MAX_BYTES = 2**30  # a re-run is matched against a fresh closure first up to these inputs' size,
FRESH_FIRST_FREE_SHARE = 8  # or up to this share (1/8) of the device's free memory, where that is more
MEMO_WRITTEN_ENTRIES = 4  # perturbed inputs (and expectations) kept per perturbation for an op that writes inputs
MEMO_WRITTEN_MAX_BYTES = 2**30  # and the bytes of those perturbed inputs kept per case, all perturbations together


_WRITTEN_BYTES = "written copies: bytes"  # the memo's count of the perturbed copies it keeps (ops that write)


STALE_VARIANT = "stale check 1, perturbed: "  # + the perturbations' names: refcache.key_material's variant


def stale_variant(key) -> str:
    """The reference cache's variant (harness/store/refcache.py `key_material`) of the perturbed
    expectation of an op that writes no input under the perturbations named `key`. The perturbed inputs
    are the case's pristine ones, cloned and changed by each perturbation in turn (`_perturbed`): a
    function of the case and of harness/ops/ (the perturbations' code, part of the key's source) alone.
    Change STALE_VARIANT's number when `_perturbed` makes them otherwise."""
    return STALE_VARIANT + "+".join(key)


def _perturbed(
    op, params, base: Any, chosen, precision: torch.dtype, memo: dict | None, key, pure: bool, cache=None, case=None
) -> tuple:
    """(perturbed inputs, `expect`) of `base` under the perturbations `chosen`, `expect()` giving their
    float64 expectation, twin and whether this call computed them (the stale check often needs none);
    both memoised in `memo` under `key`, shared by the backends of a case.

    `pure` (an op that writes no input: `base` is the case's pristine inputs, the same for every
    backend): one entry per key. The expectations are always memoised; the perturbed copy only while
    its cloned fields stay under MEMO_MAX_BYTES: past that it is made again per backend (a
    perturbation is a deterministic function of the inputs, `Perturbation.apply`), so a
    production-size pool (suites/large.yaml: 8 GiB) is not held twice more for the whole case. They
    depend on `case` alone, so the reference cache `cache` (a harness/store/refcache.py RefCache, or
    None) keeps them across runs under `stale_variant(key)`: a second run computes none (on an H100's
    warm `ci` the decode rows that needed them computed 1-3 each, 1.4 s in all).

    Not `pure` (`base` holds the written inputs as this backend's calls left them): an expectation is
    reused only for perturbed inputs bitwise equal to those it was computed from (every storage,
    `_storages_equal`), so backends that wrote the same caches (every correct one of an exact write)
    share it and a backend that wrote other bits gets its own; entries are kept, up to
    MEMO_WRITTEN_ENTRIES per key, while the perturbed copies kept for the case (whole: they hold
    every input) stay under MEMO_WRITTEN_MAX_BYTES together."""
    fields = {f for pert in chosen for f in pert.fields}

    def perturbed_copy():
        x = clone_tensors(base, only=fields)
        for pert in chosen:
            pert.apply(params, x)
        return x

    if pure:
        entry = memo.get(key) if memo is not None else None
        if entry is None:
            x = perturbed_copy()
            small = storage_bytes([getattr(x, f) for f in fields]) <= MEMO_MAX_BYTES
            entry = {"x": x if small else None, "expected": None}
            if memo is not None:
                memo[key] = entry
        else:
            x = entry["x"] if entry["x"] is not None else perturbed_copy()
    else:
        x = perturbed_copy()
        kept = memo.setdefault(key, []) if memo is not None else []
        entry = next((e for e in kept if _storages_equal(e["x"], x)), None)
        if entry is None:
            entry = {"x": x, "expected": None}
            size, held = storage_bytes(x), memo.get(_WRITTEN_BYTES, 0) if memo is not None else 0
            if memo is not None and len(kept) < MEMO_WRITTEN_ENTRIES and held + size <= MEMO_WRITTEN_MAX_BYTES:
                kept.append(entry)
                memo[_WRITTEN_BYTES] = held + size

    cached = pure and cache is not None and case is not None

    def expect() -> tuple[dict, dict, bool]:
        if entry["expected"] is None and cached:
            entry["expected"] = cache.get(case, x, stale_variant(key))[0]  # a bad entry: recomputed, replaced
            if entry["expected"] is not None:
                return (*entry["expected"], False)
        computed = entry["expected"] is None
        if computed:
            entry["expected"] = (op.expected(params, x, torch.float64), op.expected(params, x, precision))
            if cached:
                cache.put(case, *entry["expected"], x, stale_variant(key))
        return (*entry["expected"], computed)

    return x, expect


def fresh_first(x: Any) -> bool:
    """Whether the stale check runs the fresh closure on inputs `x` before any reference (`stale_check`):
    up to FRESH_FIRST_MAX_BYTES of inputs, or on a GPU up to 1/FRESH_FIRST_FREE_SHARE of its free memory
    (the fresh closure holds one more copy of them). A negative FRESH_FIRST_MAX_BYTES: never.

    Why the share: an H100's warm `targets` spent 68 s of its 143 s wall in the stale check of one GDN
    extend case (T 32768, 1.1 GiB of inputs, over the old flat 1 GiB): six float64 references of the
    changed inputs for every backend, where a fresh closure's call settles each deterministic one
    (reports/examples/h100-session21/targets2)."""
    size = storage_bytes(x)
    if FRESH_FIRST_MAX_BYTES < 0:
        return False
    if size <= FRESH_FIRST_MAX_BYTES:
        return True
    device = next((t.device for t in all_tensors(x) if t.is_cuda), None)
    if device is None:
        return False
    return size <= cuda_available_bytes(device) // FRESH_FIRST_FREE_SHARE


def _unchanged(base: Any, x: Any, chosen) -> bool:
    """True when the perturbations `chosen` left every field they change bitwise as in `base` (a roll
    of a batch of one, flags all alike): a re-run on them is a determinism repeat, nothing more."""
    for pert in chosen:
        for f in pert.fields:
            a, b = getattr(base, f), getattr(x, f)
            if isinstance(a, torch.Tensor) and not bool(bitwise_equal(a, b).all()):
                return False
    return True


def _storages_equal(a: Any, b: Any) -> bool:
    """Every tensor field of `a` and `b` (two copies of one input bundle) holds the same bytes, storage
    by storage, padding and canaries included."""
    fa, fb = tensor_fields(a), tensor_fields(b)
    if fa.keys() != fb.keys():
        return False
    for name, t in fa.items():
        u = fb[name]
        sa, sb = t.untyped_storage(), u.untyped_storage()
        if sa.nbytes() != sb.nbytes() or t.device != u.device:
            return False
        ba = torch.empty(0, dtype=torch.uint8, device=t.device).set_(sa)
        bb = torch.empty(0, dtype=torch.uint8, device=u.device).set_(sb)
        if not torch.equal(ba, bb):
            return False
    return True


def _same_outputs(a: dict, b: dict) -> bool:
    """The two calls returned the same outputs: same names, shapes, dtypes, devices and bits."""
    if a.keys() != b.keys():
        return False
    for k, t in a.items():
        u = b[k]
        if not isinstance(t, torch.Tensor) or not isinstance(u, torch.Tensor):
            return False
        if t.shape != u.shape or t.dtype != u.dtype or t.device != u.device or not bool(bitwise_equal(t, u).all()):
            return False
    return True


@dataclass
class StaleCounts:
    """What one row's stale check did: perturbations re-run, skipped (they changed nothing: pure ops),
    settled by a fresh closure's identical result, and the perturbed expectations (float64 reference
    and twin) this row computed (0 where another backend of the case had them, or none was needed).
    The row records `stale_reruns` and `stale_references`."""

    reruns: int = 0
    skipped: int = 0
    matched_fresh: int = 0
    references: int = 0


def stale_check(
    op,
    params,
    pristine,
    fn,
    work,
    verdict: Verdict,
    sync,
    rule: Rule,
    precision: torch.dtype,
    absent: dict[str, str] | None = None,
    memo: dict | None = None,
    fresh=None,
    first: dict[str, torch.Tensor] | None = None,
    counts: StaleCounts | None = None,
    planned: dict[str, str] | None = None,
    cache=None,
    case=None,
) -> None:
    """Change the inputs the closure reads, in place, and call it again: every output must follow.
    Inputs the closure declares `planned` (consumed in prepare, as a server does once per batch:
    harness/backend.py) are not changed: a perturbation of those alone is left out.

    The op's perturbations (`Op.perturbations`: each class of inputs it reads, changed to another valid
    input of the same case) are applied in turn to a copy of the inputs (`_base`: the pristine ones, each
    perturbation alone; for an op that writes its inputs the closure's buffers as the re-runs before left
    them, so there the changes accumulate), written into the closure's buffers (outputs back to their NaN
    fill), and `fn` is called again; the new
    outputs and written inputs are checked like the first call's (`check`), against the float64
    expectation and twin of the perturbed inputs. A perturbation that leaves an output as it was
    cannot fail a correct kernel. Outputs (and written inputs) that already failed the first call are
    not checked again. The first class the closure did not follow is named.
    `memo` (one dict per case) keeps the perturbed expectations, so the backends of a case share them
    (for an op that writes inputs, those of bitwise-equal perturbed inputs: `_perturbed`); for an op
    that writes no input the reference cache `cache` keeps them for later runs of `case` (`_perturbed`).
    `sync()` waits for the device.
    `fresh(x)`, when given, prepares the backend anew on a copy of inputs `x` and calls it once,
    returning `(outputs, its inputs)`: the control of a failing re-run. Where a freshly prepared
    closure fails on the changed inputs too, the re-run's failure is the tolerance edge of those
    inputs (another draw of the case's distribution), not staleness, and that class is passed over
    (on CPU, a Triton extend with a soft cap and a merge of long-tailed LSEs each had one slice a few
    percent over after their change, as freshly prepared closures did). A failing output that is
    bitwise the first call's (`first`) did not follow whatever the control says (a cache shared by
    every closure of the process replays into the fresh one too).

    Cost: the control runs first (inputs up to FRESH_FIRST_MAX_BYTES or a share of the GPU's free memory:
    `fresh_first`). Where the re-run's outputs and
    every byte of its buffers equal the fresh closure's, and no output is bitwise the first call's, the
    re-run did exactly what a closure prepared on the changed inputs does: `check` would give both the
    same problems, which the control passes over, so the perturbed expectation (a float64 reference,
    the cost of this check) is not computed. A perturbation that changes nothing of an op that writes
    no input is skipped (the determinism check repeated those calls). `counts` is told what was done.
    """
    counts = counts if counts is not None else StaleCounts()
    perts = tuple(p for p in op.perturbations(params) if not set(p.fields) <= set(planned or {}))
    if not perts:
        return
    names = op.checked_names(params)
    failed = {p.split(":", 1)[0] for p in verdict.problems} & set(names)
    skip = dict(absent or {}) | {n: "failed the first call" for n in failed if n in op.outputs_for(params)}
    pure = not op.writes_for(params)

    def rerun(chosen) -> list[str]:
        base = _base(op, params, pristine, work)
        key = tuple(p.name for p in chosen)
        x, expect = _perturbed(op, params, base, chosen, precision, memo, key, pure, cache, case)
        if pure and _unchanged(base, x, chosen):
            counts.skipped += 1
            return []
        counts.reruns += 1
        _reset_from(work, x)
        sync()
        outputs = fn()
        sync()
        if broken := outputs_contract(op, params, outputs, absent):
            return [broken]
        control = None
        if fresh is not None and fresh_first(x):
            outputs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}
            control = fresh(x)
            sync()
            if (
                not _any_as_first(outputs, first, outputs)
                and _same_outputs(outputs, control[0])
                and _storages_equal(work, control[1])
            ):
                counts.matched_fresh += 1
                return []  # what a fresh closure does on these inputs: not stale, whatever the reference says
        expected, twin, computed = expect()
        counts.references += int(computed)
        v = check(op, params, x, work, outputs, expected, twin, rule, absent=skip)
        new = [p for p in v.problems if p.split(":", 1)[0] not in failed and p not in verdict.problems]
        failing = {p.split(":", 1)[0] for p in new}
        if new and fresh is not None and not v.malformed and not _any_as_first(outputs, first, failing):
            got, inputs = control if control is not None else fresh(x)
            sync()
            control_v = check(op, params, x, inputs, got, expected, twin, rule, absent=skip)
            if [p for p in control_v.problems if p.split(":", 1)[0] not in failed]:
                return []  # a fresh closure fails these inputs too: their tolerance edge, not staleness
        return new

    for pert in perts:  # in turn: together, one change can hide another (targets no draft holds
        problems = rerun((pert,))  # make the drafts irrelevant)
        if problems:
            verdict.problems.append(
                f"stale output: {_what(pert)} changed in place and the closure did not follow: {problems[0]}"
            )
            return


def _any_as_first(outputs: dict, first: dict | None, names) -> bool:
    """Whether any output of `names` is bitwise the first call's (a result replayed, not recomputed)."""
    return first is not None and any(
        n in first and n in outputs and isinstance(outputs[n], torch.Tensor)
        and outputs[n].shape == first[n].shape and bool(bitwise_equal(outputs[n], first[n]).all())
        for n in names
    )  # fmt: skip


def _what(pert) -> str:
    return f"the {pert.name} ({', '.join(pert.fields)})"


def outputs_changed(
    before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], free: dict[str, torch.Tensor] | None = None
) -> bool:
    """True when any output differs bitwise between two runs, outside the elements the contract leaves
    open (`free`: `Op.unspecified`'s masks; a padding row may hold anything, a different thing each call)."""
    for k in before:
        if k not in after:
            continue
        differs = ~bitwise_equal(before[k], after[k])
        if free and k in free:
            differs = differs & ~free[k].to(differs.device)
        if bool(differs.any()):
            return True
    return False
