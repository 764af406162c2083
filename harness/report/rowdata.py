"""The rows of a run as one compact JSON payload for report.html's script: the filterable results table
and the per-case view (every backend's errors, timings and repro command) are drawn from it, so each
number is in the page once.

Payload: {"cases": [{id, op, cls, features}], "backends": [...], "reasons": [...], "rows": [row...],
"repro": [prefix, suffix]}; a row's keys are short (c case index, b backend index, s status, r reason
index, ...) and absent when empty. `x` (time over the case's best passing GPU time) is set only on rows
that may be ranked.
"""

from __future__ import annotations

import json
import shlex

from attnbench.counts import status_of
from attnbench.report import ranking
from attnbench.report.common import fmt, interpreted, repro_tail

_KIND = {ranking.GPU: "gpu", ranking.HOST: "host", ranking.INTERPRETER: "interp"}


def _flags(t: dict) -> str:
    out = ""
    if t.get("mode") == "cuda-graph":
        out += "G"
    if not t.get("converged", True):
        out += "*"
    if t.get("n_throttled"):
        out += "T"
    return out


def _errors(m: dict) -> tuple[list, float | None]:
    """The per-output detail rows (the page's script makes the one-line summary from them) and the
    worst error / bound ratio."""
    detail, worst = [], None
    for name, mm in m.items():
        if mm.get("exact"):
            wrong = mm.get("wrong", 0)
            detail.append([name, "bitwise", f"{wrong} wrong" if wrong else "exact"])
        elif "max_abs" in mm:
            ratio = mm["max_abs"] / mm["bound"] if mm.get("bound") else None
            if ratio is not None and (worst is None or not ratio <= worst):
                worst = ratio
            detail.append(
                [
                    name,
                    fmt(mm.get("max_abs")),
                    fmt(mm.get("bound")),
                    fmt(ratio),
                    fmt(mm.get("max_rel")),
                    fmt(mm.get("rel_l2")),
                    f"{mm['cos']:.6f}" if mm.get("cos") is not None else "",
                    f"{100 * mm['mismatch']:.3g}%" if mm.get("mismatch") is not None else "",
                    str(mm.get("nonfinite", "")),
                    " ".join(f"{k} {v}" for k, v in (mm.get("worst") or {}).items()),
                    fmt(mm.get("twin_max_abs")),
                ]
            )
    return detail, worst


def _num(x, digits: int = 4):
    if x is None:
        return None
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    return float(f"{x:.{digits}g}")


def payload(rows, run: dict) -> dict:
    winners = ranking.case_winners(rows)
    cases: dict[str, int] = {}
    case_list, backends, reasons = [], sorted({r.backend for r in rows}), {}
    out = []
    for r in rows:
        if r.case_id not in cases:
            cases[r.case_id] = len(case_list)
            case_list.append({"id": r.case_id, "op": r.op, "cls": ranking.shape_class(r), "f": list(r.features)})
        st = status_of(r)
        d: dict = {"c": cases[r.case_id], "b": backends.index(r.backend), "s": st}
        if r.reason:
            d["r"] = reasons.setdefault(r.reason, len(reasons))
        detail, worst = _errors(r.metrics or {})
        if detail:
            d["d"] = detail
        if worst is not None:
            d["q"] = _num(worst, 3)
        if r.tolerance_why:
            d["w"] = r.tolerance_why
        t, dv = r.timing or {}, r.derived or {}
        if t:
            d |= {"k": _KIND[ranking.timing_kind(r)], "m": _num(t.get("median_us")), "lo": _num(t.get("p10_us")),
                  "hi": _num(t.get("p90_us")), "cv": _num(t.get("cv"), 3), "n": t.get("n")}  # fmt: skip
            if _flags(t):
                d["g"] = _flags(t)
            for key, src in (("tf", "tflops"), ("tb", "tbps"), ("rf", "roofline_pct"), ("ai", "intensity")):
                if dv.get(src) is not None:
                    d[key] = _num(dv[src], 3)
            w = winners.get(r.case_id)
            if w and ranking.rankable(r):
                d["x"] = _num(t["median_us"] / w.best_us, 4)
        if interpreted(r):
            d["ti"] = 1  # the repro sets TRITON_INTERPRET=1
        if r.prepare_s is not None:
            d["p"] = _num(r.prepare_s, 3)
        if r.prepare_info:
            d["pi"] = ", ".join(f"{k} {fmt(v)}" for k, v in r.prepare_info.items())
        out.append(d)
    return {
        "cases": case_list,
        "backends": backends,
        "reasons": list(reasons),
        "rows": out,
        "repro": ["attnbench sweep --case", shlex.join(repro_tail(run))],
    }


def payload_json(rows, run: dict) -> str:
    """The payload as JSON that is inert inside a <script> element: `<`, `>` and `&` (which occur only
    inside strings: backend names, reasons) as \\u escapes, so neither `</script>` nor `<!--` in a
    plugin's name or an exception message can end the element or change how the page parses it."""
    text = json.dumps(payload(rows, run), separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
