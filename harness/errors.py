"""One exception base for everything attnbench reports to a user without a traceback."""

from __future__ import annotations


class AttnbenchError(Exception):
    """An error a user can fix: printed as one message, exit code 2."""


class SuiteError(AttnbenchError):
    """A suite file is invalid. `str()` is `file:line: what is wrong`."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path, self.line, self.message = str(path), line, message
        where = f"{self.path}:{line}" if line else self.path
        super().__init__(f"{where}: {message}")


class Unsupported(Exception):
    """Raised inside `prepare` when a backend finds out late that it cannot run a case (becomes a skip)."""
