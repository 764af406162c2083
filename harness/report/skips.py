"""Why a backend ran nothing in a sweep: one line per backend, not per row (the console after a sweep).

A backend "ran nothing" when every one of its rows is a skip. Its reason is the backend's own
`available()` answer when that is among its rows' reasons (a library not installed, no CUDA GPU, how
to enable the Triton interpreter): that is the one thing to fix. Otherwise it is the most common
reason of its rows, with how many other reasons there were.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from attnbench.store.counts import status_of


@dataclass(frozen=True)
class Skipped:
    backend: str
    rows: int
    reason: str  # one line


def skipped_backends(rows, backends: Mapping[str, object] = {}) -> list[Skipped]:  # noqa: B006
    """The backends whose every row skipped, in the rows' order, each with its one-line reason.

    `backends`: registered backends by name; a name's `available()` is preferred as the reason when its
    rows give it (a plugin's backend not loaded here is judged by its rows alone).
    """
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(r.backend, []).append(r)
    out = []
    for name, mine in by.items():
        if not all(status_of(r) == "skip" for r in mine):
            continue
        reasons = Counter(_one_line(r.reason) for r in mine)
        unavailable = _available(backends.get(name))
        if unavailable is not None and unavailable in reasons:
            top = unavailable
        else:
            top = reasons.most_common(1)[0][0]
        others = len(reasons) - 1
        more = f" (+{others} other reason{'s' * (others > 1)}: see the report)" if others else ""
        out.append(Skipped(name, len(mine), f"{top}{more}"))
    return out


def _available(backend) -> str | None:
    try:
        why = backend.available() if backend is not None else None
    except Exception:  # a plugin's check that raises says nothing here; its rows still do
        return None
    return _one_line(why) if why else None


def _one_line(text) -> str:
    return " ".join(str(text or "no reason given").split())
