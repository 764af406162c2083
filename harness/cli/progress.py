"""Console output of a sweep that reads well on a terminal and in a CI log.

On a terminal, progress is rich's live bar. Elsewhere (CI, a pipe, a file) it is plain lines at a
steady rate: `progress: rows n/N (p%), pass a, fail b, error c, skip d, elapsed t, ETA e`, one every
`ATTNBENCH_PROGRESS_S` seconds (default 30) while rows are missing and one when the sweep ends.
Failures are printed as they arrive in both modes. Consoles never hard-wrap a line (paths and case
ids stay whole) and are wide when not on a terminal, so tables are not squeezed to 80 columns.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

from rich.console import Console
from rich.markup import escape as esc
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

WIDE = 240  # columns of a console that is not a terminal (CI logs wrap or scroll on their own)


def make_console(stderr: bool) -> Console:
    """A console that never wraps a printed line (tables still fit its width)."""
    return Console(stderr=stderr, soft_wrap=True)


def widen(console: Console) -> None:
    """Give a console that is not a terminal a wide line (call when a command starts: tests swap streams)."""
    console.width = WIDE if not console.is_terminal else None  # None: the terminal's own width


def _duration(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


class SweepProgress:
    """Counts rows by status and shows them: a live bar on a terminal, plain timed lines elsewhere.

    Use as a context manager; `rows(description, case_rows)` after every batch of rows, `problem(msg)`
    for a warning, `status(msg)` for what is happening now (precompiling, ...).
    """

    def __init__(self, console: Console, total: int, done: int = 0, every_s: float | None = None):
        self.console, self.total, self.done = console, total, done
        self.counts: Counter[str] = Counter()
        self.live = console.is_terminal
        self.every_s = every_s if every_s is not None else float(os.environ.get("ATTNBENCH_PROGRESS_S", "30"))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._done0 = done
        self._progress: Progress | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> SweepProgress:
        if self.live:
            self._progress = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[tally]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("rows", total=self.total, completed=self.done, tally=self._tally())
        else:
            self.line()
            self._thread = threading.Thread(target=self._tick, name="attnbench-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=1)
            self._thread = None
            self.line()

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            self.line()

    # ---- events -----------------------------------------------------------------------------------
    def rows(self, description: str, case_rows) -> None:
        with self._lock:
            self.counts.update(r.status for r in case_rows)
            self.done += len(case_rows)
        for r in case_rows:
            if r.status in ("fail", "error", "xpass", "xfail"):  # xfail: shown with the expectation's why
                color = "yellow" if r.status == "xfail" else "red"
                self.print(f"[{color}]{r.status}[/] {r.case_id} {esc(f'[{r.backend}]: {r.reason}')}")
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, description=description[:60], tally=self._tally())

    def status(self, msg: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=msg)
        else:
            self.print(esc(msg))

    def problem(self, msg: str) -> None:
        self.print(f"[yellow]warning:[/] {esc(msg)}")

    def print(self, text: str) -> None:
        (self._progress.console if self._progress is not None else self.console).print(text, highlight=False)

    # ---- plain lines ------------------------------------------------------------------------------
    def _tally(self) -> str:
        c = self.counts
        return (
            f"[green]{c['pass']} pass[/] [red]{c['fail']} fail[/] [magenta]{c['error']} error[/] "
            f"[dim]{c['skip']} skip[/]"
        )

    def line(self) -> None:
        """One plain progress line: rows n/N, counts so far, elapsed and ETA."""
        with self._lock:
            done, c = self.done, dict(self.counts)
        elapsed = time.monotonic() - self._t0
        ran = done - self._done0
        left = self.total - done
        eta = _duration(elapsed / ran * left) if ran and left > 0 else ("0s" if left <= 0 else "?")
        pct = 100 * done / self.total if self.total else 100.0
        counts = ", ".join(f"{s} {c.get(s, 0)}" for s in ("pass", "fail", "error", "skip"))
        extra = "".join(f", {s} {n}" for s, n in c.items() if s not in ("pass", "fail", "error", "skip"))
        self.console.print(
            f"progress: rows {done}/{self.total} ({pct:.0f}%), {counts}{extra}, elapsed {_duration(elapsed)}, "
            f"ETA {eta}",
            highlight=False,
            markup=False,
        )
