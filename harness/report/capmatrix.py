"""The compact capability matrix of a run: one symbol per (op or op/feature, backend) cell, every skip
reason once as a numbered footnote, and backends that ran nothing for one reason (not installed, no
GPU) collapsed into one line each."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from attnbench.store.counts import FAILING, status_of

ALL, SOME, NONE = "●", "◐", "○"


@dataclass
class Cell:
    ran: int = 0
    total: int = 0
    failing: int = 0
    reasons: Counter = field(default_factory=Counter)
    notes: list[int] = field(default_factory=list)  # footnote numbers

    @property
    def symbol(self) -> str:
        if not self.total:
            return ""
        return ALL if self.ran == self.total else (NONE if self.ran == 0 else SOME)

    @property
    def css(self) -> str:
        if not self.total:
            return "na"
        if self.failing:
            return "bad"
        return {ALL: "all", SOME: "some", NONE: "none"}[self.symbol]

    def title(self) -> str:
        if not self.total:
            return ""
        t = f"runs {self.ran} of {self.total} cases"
        if self.failing:
            t += f"; {self.failing} of them fail or error"
        return t

    def key(self) -> tuple:
        return (self.symbol, self.failing > 0)


@dataclass
class Matrix:
    backends: list[str]
    rows: list[tuple[str, bool, list[Cell]]]  # (label, is a feature row, cells)
    notes: list[str]  # footnote n is notes[n - 1]
    unavailable: list[tuple[list[str], str]]  # (backends, the one reason) for backends that ran nothing


def _unavailable(rows) -> dict[str, str]:
    """Backends whose every row is a skip with one and the same reason."""
    reasons: dict[str, set] = {}
    ran: set[str] = set()
    for r in rows:
        if status_of(r) == "skip":
            reasons.setdefault(r.backend, set()).add(r.reason)
        else:
            ran.add(r.backend)
    return {b: next(iter(rs)) for b, rs in reasons.items() if b not in ran and len(rs) == 1}


def build(rows) -> Matrix:
    gone = _unavailable(rows)
    backends = sorted({r.backend for r in rows} - set(gone))
    cells: dict[str, dict[str, Cell]] = {}
    for r in rows:
        if r.backend in gone:
            continue
        st = status_of(r)
        for key in (r.op, *(f"{r.op} / {f}" for f in r.features)):
            c = cells.setdefault(key, {}).setdefault(r.backend, Cell())
            c.total += 1
            if st == "skip":
                c.reasons[r.reason] += 1
            else:
                c.ran += 1
                c.failing += st in FAILING
    notes: dict[str, int] = {}
    out = []
    ops = sorted({k for k in cells if " / " not in k})
    for op in ops:
        base = [cells[op].get(b, Cell()) for b in backends]
        out.append((op, False, base))
        for key in sorted(k for k in cells if k.startswith(op + " / ")):
            row = [cells[key].get(b, Cell()) for b in backends]
            if any(c.key() != o.key() for c, o in zip(row, base, strict=True)):
                out.append((key, True, row))
    for _, _, row in out:
        for c in row:
            for reason, _ in c.reasons.most_common():
                c.notes.append(notes.setdefault(reason, len(notes) + 1))
    by_reason: dict[str, list[str]] = {}
    for b, reason in sorted(gone.items()):
        by_reason.setdefault(reason, []).append(b)
    return Matrix(backends, out, list(notes), [(bs, reason) for reason, bs in by_reason.items()])
