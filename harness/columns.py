"""The one column registry: how a result row becomes a flat table (results.csv, the markdown tables).

A `Column` is a name, how to read it from a row, and what it means. `csv_columns(rows)` is results.csv's
header, in order: the row's identity and verdict, timing, derived rates, then the error columns of
every output and written input (per name: `<name>_max_abs` and `<name>_bound` for a numeric one,
`<name>_wrong` for an exact one), the costs and parameters, then the fields the checks record
(`Check.records`, harness/checklist.py: `deterministic`, `batch_invariant`, and those of registered
checks). The output names come from every op's declared outputs (attnbench.ops) and from the rows'
own metrics (written inputs, ops of a plugin), so no op's outputs go without error columns.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Column:
    name: str
    get: Callable[[Any], Any]  # row (attnbench.results.Result) -> value
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
    from attnbench.checklist import active

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
