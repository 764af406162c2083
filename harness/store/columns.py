"""The one column registry: how a result row becomes a flat table (results.csv, the markdown tables).

A `Column` is a name, how to read it from a row, and what it means. `csv_columns(rows)` is results.csv's
header, in order: the row's identity and verdict, timing, derived rates, then the error columns of
every output and written input (per name: `<name>_max_abs` and `<name>_bound` for a numeric one,
`<name>_wrong` for an exact one), the costs and parameters, then the fields the checks record
(`Check.records`, harness/check/checklist.py: `deterministic`, `batch_invariant`, and those of registered
checks). The output names come from every op's declared outputs (attnbench.ops) and from the rows'
own metrics (written inputs, ops of a plugin), so no op's outputs go without error columns.

The page (report.html) takes its row data and its results table from here too: `PAGE_FIELDS` are the
keys of a row in the page's data (short: a page holds thousands of rows; absent when empty), `ERROR_DETAIL`
the per-output error table of the case view, and `page_columns(rows)` the results table's columns (what
each shows, sorts by and how results.js draws it), an error column for every output the rows hold
included. harness/report/rowdata.py fills the data from them; results.js builds its table from them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Column:
    name: str
    get: Callable[[Any], Any]  # row (attnbench.store.results.Result) -> value
    what: str = ""


def _attr(name: str, what: str = "") -> Column:
    return Column(name, lambda r: getattr(r, name, None), what)


def _timing(name: str, key: str | None = None, what: str = "") -> Column:
    return Column(name, lambda r: (r.timing or {}).get(key or name), what)


def _derived(name: str, what: str = "") -> Column:
    return Column(name, lambda r: (r.derived or {}).get(name), what)


def _ci(i: int) -> Callable:
    return lambda r: ((r.timing or {}).get("ci95_us") or [None, None])[i]


IDENTITY = (
    _attr("case_id"),
    _attr("op"),
    _attr("backend"),
    Column("status", lambda r: str(r.status), "pass | fail | xfail | xpass | skip | error"),
    _attr("reason"),
    _attr("dtype"),
    _attr("seed"),
    _attr("suite"),
)
TIMING = (
    _timing("median_us"),
    Column("ci95_lo_us", _ci(0), "95% CI of the median"),
    Column("ci95_hi_us", _ci(1), "95% CI of the median"),
    _timing("p10_us"),
    _timing("p90_us"),
    _timing("min_us"),
    _timing("cv"),
    _timing("n"),
    _timing("clock"),
    _timing("mode"),
    _timing("converged"),
    _timing("n_throttled"),
)
DERIVED = tuple(_derived(n) for n in ("tflops", "tbps", "intensity", "roofline_pct", "limiter", "flops", "bytes"))
COSTS = (
    _attr("prepare_s"),
    _attr("check_s"),
    _attr("reference_s"),
    Column("params", lambda r: json.dumps(r.params, sort_keys=True), "the case's parameters (JSON)"),
)
FIRST_OUTPUTS = ("o", "lse")  # attention's outputs lead (the columns results.csv always had)


def _metric(output: str, key: str) -> Column:
    return Column(f"{output}_{key}", lambda r: ((r.metrics or {}).get(output) or {}).get(key),
                  f"{output}: {key} against the float64 reference")  # fmt: skip


def output_names(rows: Iterable = ()) -> dict[str, bool]:
    """Every output and written input a table has error columns for -> whether it is compared exactly:
    the ops' declared outputs (o and lse first), then names found in the rows' metrics."""
    from attnbench.ops import OPS

    found: dict[str, bool] = dict.fromkeys(FIRST_OUTPUTS, False)
    for op in OPS.values():
        for name, spec in op.outputs.items():
            found.setdefault(name, bool(spec.exact))
    for r in rows:
        for name, m in (r.metrics or {}).items():
            found.setdefault(name, bool((m or {}).get("exact")))
    return found


def error_columns(rows: Iterable = ()) -> tuple[Column, ...]:
    cols: list[Column] = []
    for name, exact in output_names(rows).items():
        cols += [_metric(name, "wrong")] if exact else [_metric(name, "max_abs"), _metric(name, "bound")]
    return tuple(cols)


def check_columns() -> tuple[Column, ...]:
    """The row fields the active checks record (their `records`, but `metrics`: the error columns)."""
    from attnbench.check.checklist import active

    return tuple(_attr(f, f"recorded by the {c.name} check") for c in active() for f in c.records if f != "metrics")


def csv_columns(rows: Iterable = ()) -> tuple[Column, ...]:
    rows = list(rows)
    return IDENTITY + TIMING + DERIVED + error_columns(rows) + COSTS + check_columns()


def by_name(names: Iterable[str], rows: Iterable = ()) -> tuple[Column, ...]:
    """The registry's columns of these names (KeyError naming an unknown one)."""
    known = {c.name: c for c in csv_columns(rows)}
    return tuple(known[n] for n in names)


def md_table(
    rows: list, names: Iterable[str | tuple[str, str]], fmt: dict[str, Callable[[Any], str]] | None = None
) -> list[str]:
    """A markdown table of `rows`, one line per row, with the registry's columns `names` (a name, or
    (name, header)); `fmt`: how a column's value is written, by name (default: as text)."""
    pairs = [(n, n) if isinstance(n, str) else n for n in names]
    cols, fmt = by_name([n for n, _ in pairs], rows), fmt or {}
    lines = ["| " + " | ".join(h for _, h in pairs) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt.get(c.name, _text)(c.get(r)) for c in cols) + " |")
    return lines


def _text(v: Any) -> str:
    return "" if v is None else str(v)


# ---- the page: report.html's row data, results table and per-case error table ----------------------
def fmt(x, digits: int = 3) -> str:
    """Numbers for people: 3 significant digits, scientific outside [1e-2, 1e5)."""
    if x is None or x == "":
        return ""
    if isinstance(x, float):
        if x == 0:
            return "0"
        if math.isinf(x) or math.isnan(x):
            return str(x)
        if abs(x) >= 1e5 or abs(x) < 1e-2:
            return f"{x:.{digits - 1}e}"
        if abs(x) >= 10**digits:
            return f"{x:.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def _num(x, digits: int = 4):
    """A number as the page's data holds it: `digits` significant digits; NaN and infinities as text."""
    if x is None:
        return None
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    return float(f"{x:.{digits}g}")


def _ratio(m: dict) -> float | None:
    """An output's max abs error over its bound (None without a bound)."""
    return m["max_abs"] / m["bound"] if m.get("bound") and m.get("max_abs") is not None else None


@dataclass(frozen=True)
class PageRow:
    """A row with what the report worked out for it (harness/report/rowdata.py): its status, the indices
    into the page's case, backend and reason lists, its timing kind (`gpu`, `host`, `interp`), its time over
    the case's best (only on rows that may be ranked) and whether its repro runs the Triton interpreter."""

    row: Any  # attnbench.store.results.Result
    status: str
    case: int
    backend: int
    reason: int | None
    kind: str | None
    x: float | None
    interpreted: bool


ERROR_DETAIL = (
    Column("output", lambda nm: nm[0]),
    Column("max abs", lambda nm: fmt(nm[1].get("max_abs"))),
    Column("bound", lambda nm: fmt(nm[1].get("bound"))),
    Column("max abs / bound", lambda nm: fmt(_ratio(nm[1]))),
    Column("max rel", lambda nm: fmt(nm[1].get("max_rel"))),
    Column("rel L2", lambda nm: fmt(nm[1].get("rel_l2"))),
    Column("cosine", lambda nm: f"{nm[1]['cos']:.6f}" if nm[1].get("cos") is not None else ""),
    Column("over bound", lambda nm: f"{100 * nm[1]['mismatch']:.3g}%" if nm[1].get("mismatch") is not None else ""),
    Column("NaN/Inf", lambda nm: str(nm[1].get("nonfinite", ""))),
    Column("worst at", lambda nm: " ".join(f"{k} {v}" for k, v in (nm[1].get("worst") or {}).items())),
    Column("twin max abs", lambda nm: fmt(nm[1].get("twin_max_abs"))),
)
"""The case view's error table: one line per (output name, its metrics) of a row that has a bound; an
exact output's line is [name, "bitwise", "exact" or "N wrong"] (`error_detail`)."""


def error_detail(metrics: dict) -> list[list[str]]:
    """A row's lines of the case view's error table (`ERROR_DETAIL`), in the row's output order."""
    lines = []
    for name, m in (metrics or {}).items():
        if m.get("exact"):
            wrong = m.get("wrong", 0)
            lines.append([name, "bitwise", f"{wrong} wrong" if wrong else "exact"])
        elif "max_abs" in m:
            lines.append([c.get((name, m)) for c in ERROR_DETAIL])
    return lines


def worst_ratio(metrics: dict) -> float | None:
    """The largest max abs / bound over a row's outputs (NaN counts as the largest)."""
    worst = None
    for m in (metrics or {}).values():
        ratio = None if m.get("exact") or "max_abs" not in m else _ratio(m)
        if ratio is not None and (worst is None or not ratio <= worst):
            worst = ratio
    return worst


def output_errors(metrics: dict) -> dict:
    """Per output: max abs / bound (numeric) or the count of wrong elements (exact): the page's error
    column of each output."""
    out = {}
    for name, m in (metrics or {}).items():
        v = m.get("wrong", 0) if m.get("exact") else _ratio(m) if "max_abs" in m else None
        if v is not None:
            out[name] = _num(v, 3)
    return out


def _flags(t: dict) -> str:
    """G: timed as a CUDA graph; *: did not converge; T: throttled samples."""
    out = "G" if t.get("mode") == "cuda-graph" else ""
    out += "" if t.get("converged", True) else "*"
    return out + ("T" if t.get("n_throttled") else "")


def _timed(get: Callable[[PageRow], Any]) -> Callable[[PageRow], Any]:
    """A field of timed rows only."""
    return lambda pr: get(pr) if pr.row.timing else None


def _t(key: str, digits: int = 4) -> Callable[[PageRow], Any]:
    return _timed(lambda pr: _num(pr.row.timing.get(key), digits))


def _d(key: str) -> Callable[[PageRow], Any]:
    return _timed(lambda pr: _num((pr.row.derived or {}).get(key), 3))


PAGE_FIELDS = (
    Column("c", lambda pr: pr.case, "index into the page's cases"),
    Column("b", lambda pr: pr.backend, "index into the page's backends"),
    Column("s", lambda pr: pr.status, "status"),
    Column("r", lambda pr: pr.reason, "index into the page's reasons"),
    Column("d", lambda pr: error_detail(pr.row.metrics), "the case view's error lines (ERROR_DETAIL)"),
    Column("q", lambda pr: _num(worst_ratio(pr.row.metrics), 3), "worst max abs / bound"),
    Column("e", lambda pr: output_errors(pr.row.metrics), "per output: max abs / bound, or wrong elements"),
    Column("w", lambda pr: pr.row.tolerance_why, "why the tolerance was widened"),
    Column("k", _timed(lambda pr: pr.kind), "timing kind: gpu, host, interp"),
    Column("m", _t("median_us"), "median µs"),
    Column("lo", _t("p10_us"), "p10 µs"),
    Column("hi", _t("p90_us"), "p90 µs"),
    Column("cv", _t("cv", 3), "coefficient of variation"),
    Column("n", _timed(lambda pr: pr.row.timing.get("n")), "samples"),
    Column("g", _timed(lambda pr: _flags(pr.row.timing)), "timing flags"),
    Column("tf", _d("tflops"), "TFLOP/s"),
    Column("tb", _d("tbps"), "TB/s"),
    Column("rf", _d("roofline_pct"), "% of the roofline"),
    Column("ai", _d("intensity"), "FLOP per byte"),
    Column("x", _timed(lambda pr: _num(pr.x, 4)), "time over the case's best passing GPU time"),
    Column("ti", lambda pr: 1 if pr.interpreted else None, "the repro sets TRITON_INTERPRET=1"),
    Column("p", lambda pr: _num(pr.row.prepare_s, 3), "prepare seconds"),
    Column("pi", lambda pr: ", ".join(f"{k} {fmt(v)}" for k, v in (pr.row.prepare_info or {}).items()), "prepare"),
)


def page_row(pr: PageRow) -> dict:
    """One row of the page's data: every `PAGE_FIELDS` key whose value is not empty."""
    out = {}
    for f in PAGE_FIELDS:
        v = f.get(pr)
        if v is not None and v != "" and v != [] and v != {}:
            out[f.name] = v
    return out


@dataclass(frozen=True)
class PageColumn:
    """One column of the page's results table. `value`: what it shows and sorts by, a key of the row's
    data (`e.o`: a key inside one) or, with `@`, what results.js derives (`@case`, `@op`, `@backend`,
    `@features`, `@repro`, `@reason`); `render`: how results.js draws a cell (its RENDER); `shown`: on by
    default; `case`: the renderer of its cell in the per-case view ("" = not there)."""

    key: str
    header: str
    value: str
    render: str = "text"
    shown: bool = True
    cls: str = ""
    case: str = ""


PAGE_COLUMNS = (
    PageColumn("case", "case", "@case", "case", cls="mono case"),
    PageColumn("op", "op", "@op", shown=False),
    PageColumn("backend", "backend", "@backend", case="text"),
    PageColumn("status", "status", "s", "status", case="status"),
    PageColumn("err", "error / bound", "q", "errors", cls="mono small"),
    PageColumn("median", "median µs", "m", "time", cls="num", case="time"),
    PageColumn("spread", "p10–p90", "lo", "spread", cls="num", case="spread"),
    PageColumn("cv", "CV", "cv", "percent", cls="num", case="percent"),
    PageColumn("n", "n", "n", shown=False, cls="num"),
    PageColumn("tf", "TFLOP/s", "tf", "num", cls="num"),
    PageColumn("tb", "TB/s", "tb", "num", cls="num"),
    PageColumn("ai", "FLOP/B", "ai", "num", shown=False, cls="num"),
    PageColumn("rf", "roofline", "rf", "roofline", cls="num", case="roofline"),
    PageColumn("x", "× best", "x", "times", cls="num", case="times"),
    PageColumn("prep", "prepare s", "p", "prepare", shown=False, cls="num wrap", case="num"),
    PageColumn("reason", "reason · prepare details", "@reason", "reason", shown=False, cls="reason", case="reason"),
    PageColumn("feat", "features", "@features", shown=False, cls="small"),
    PageColumn("repro", "repro", "@repro", shown=False, cls="mono small repro"),
)


def page_columns(rows: Iterable = ()) -> tuple[PageColumn, ...]:
    """The results table's columns: `PAGE_COLUMNS`, then one error column per output the rows hold
    (off by default; max abs / bound, or the count of wrong elements of an exact output), in
    `output_names` order."""
    rows = list(rows)
    held = {name for r in rows for name in (r.metrics or {})}
    extra = tuple(
        PageColumn(f"err:{name}", f"{name} {'wrong' if exact else 'error / bound'}", f"e.{name}", "num", False, "num")
        for name, exact in output_names(rows).items()
        if name in held
    )
    return PAGE_COLUMNS + extra
