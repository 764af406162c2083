"""The winners view: cases × backends, each cell the backend's time over the best passing GPU time of
the case. Only passing GPU-timed cells are coloured; failing cells are marked and never coloured as
fast; skips are blank; non-GPU timings are shown as such, uncoloured."""

from __future__ import annotations

import math

from attnbench.report import ranking
from attnbench.report.common import fmt
from attnbench.store.counts import FAILING, status_of


def colour(x: float) -> str:
    """Green at 1× (the best), through yellow to red at ≥4×, on a log scale."""
    f = min(1.0, math.log(max(x, 1.0)) / math.log(4.0))
    return f"hsl({130 - 130 * f:.0f} 65% {88 - 8 * f:.0f}%)"


def _cell(r, w) -> dict:
    st = status_of(r)
    med = ranking.median_us(r)
    best_us = w.best_us if w else None
    if st == "skip":
        return {"css": "w-skip", "text": "–"}
    if ranking.ranks(r) and best_us:
        return _ranked(r, med, best_us, w)
    if st in FAILING or st == "xfail":
        took = f", took {fmt(med)} µs" if med else ""
        return {"css": "w-bad", "text": "✗ " + st, "sort": 1e9, "title": f"{st}{took}: {r.reason[:160]}"}
    if not med:
        return {"css": "w-pass", "text": "✓", "sort": 1e8, "title": "passed (not timed)"}
    if not ranking.rankable(r):
        kind = ranking.timing_kind(r)
        return {"css": "w-host", "text": f"{fmt(med)} µs", "sort": 1e8, "title": f"{kind}: not ranked"}
    return _ranked(r, med, best_us, w)


def _ranked(r, med: float, best_us: float, w) -> dict:
    """A ranked cell: its time over the best; "≈" when tied with the best; a known finding marked †."""
    x = med / best_us
    best, tie = r.backend == w.best, r.backend in w.tied
    note = ranking.mark(r)
    text = "best" if best else (f"≈{x:.2f}×" if tie else f"{x:.2f}×")
    title = (
        f"{fmt(med)} µs ({x:.2f}× the best{', tied with it: CIs overlap or within the gate threshold' if tie else ''})"
    )
    return {
        "css": "w-best" if best else "w-rank",
        "text": text + (" †" if note else ""),
        "sort": x,
        "style": f"background:{colour(x)}",
        "title": title + (f"; ranked on its passing outputs: {note}" if note else ""),
    }


def view(rows) -> dict:
    """{backends, cases: [{id, op, cls, best, best_us, cells}]}; backends that only skipped are left out."""
    wins = ranking.case_winners(rows)
    backends = sorted({r.backend for r in rows if status_of(r) != "skip"})
    by_case: dict[str, dict] = {}
    for r in rows:
        by_case.setdefault(r.case_id, {"op": r.op, "cls": ranking.shape_class(r), "rows": {}})["rows"][r.backend] = r
    cases = []
    for cid, c in by_case.items():
        if not any(status_of(r) != "skip" for r in c["rows"].values()):
            continue
        w = wins.get(cid)
        best_us = w.best_us if w else None
        cells = [_cell(c["rows"][b], w) if b in c["rows"] else {"css": "w-skip", "text": ""} for b in backends]
        cases.append({"id": cid, "op": c["op"], "cls": c["cls"], "best": " ≈ ".join([w.best, *w.tied]) if w else "",
                      "best_us": fmt(best_us), "best_v": best_us, "cells": cells})  # fmt: skip
    return {"backends": backends, "cases": cases, "ranked": len(wins)}
