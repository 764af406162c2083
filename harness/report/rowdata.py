"""The rows of a run as one compact JSON payload for report.html's script: the filterable results table
and the per-case view (every backend's errors, timings and repro command) are drawn from it, so each
number is in the page once.

Payload: {"cases": [{id, op, cls, f}], "backends": [...], "reasons": [...], "rows": [row...], "columns":
[the results table's columns], "detail": [the case view's error table headers], "repro": [prefix,
suffix]}. What a row holds, the table's columns and the error table all come from the column registry
(attnbench.store.columns: `PAGE_FIELDS`, `page_columns`, `ERROR_DETAIL`); this module works out what the
registry reads (indices, timing kind, time over the best) and nothing else. `x` is set only on rows
that may be ranked.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

from attnbench.report import ranking
from attnbench.report.common import interpreted, repro_tail
from attnbench.store.columns import ERROR_DETAIL, PageRow, page_columns, page_row
from attnbench.store.counts import status_of

_KIND = {ranking.GPU: "gpu", ranking.HOST: "host", ranking.INTERPRETER: "interp"}


def payload(rows, run: dict) -> dict:
    winners = ranking.case_winners(rows)
    cases: dict[str, int] = {}
    case_list, backends, reasons = [], sorted({r.backend for r in rows}), {}
    out = []
    for r in rows:
        if r.case_id not in cases:
            cases[r.case_id] = len(case_list)
            case_list.append({"id": r.case_id, "op": r.op, "cls": ranking.shape_class(r), "f": list(r.features)})
        w = winners.get(r.case_id)
        timed = bool(r.timing)
        pr = PageRow(
            row=r,
            status=status_of(r),
            case=cases[r.case_id],
            backend=backends.index(r.backend),
            reason=reasons.setdefault(r.reason, len(reasons)) if r.reason else None,
            kind=_KIND[ranking.timing_kind(r)] if timed else None,
            x=r.timing["median_us"] / w.best_us if timed and w and ranking.rankable(r) else None,
            interpreted=interpreted(r),
        )
        out.append(page_row(pr))
    return {
        "cases": case_list,
        "backends": backends,
        "reasons": list(reasons),
        "rows": out,
        "columns": [dataclasses.asdict(c) for c in page_columns(rows)],
        "detail": [c.name for c in ERROR_DETAIL],
        "repro": ["attnbench sweep --case", shlex.join(repro_tail(run))],
    }


def payload_json(rows, run: dict) -> str:
    """The payload as JSON that is inert inside a <script> element: `<`, `>` and `&` (which occur only
    inside strings: backend names, reasons) as \\u escapes, so neither `</script>` nor `<!--` in a
    plugin's name or an exception message can end the element or change how the page parses it."""
    text = json.dumps(payload(rows, run), separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
