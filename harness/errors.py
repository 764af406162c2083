"""One exception base for everything attnbench reports to a user without a traceback."""

from __future__ import annotations

import traceback


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


OUT_OF_MEMORY = "out of memory: "  # starts the reason of a row whose backend or inputs ran out of memory


def out_of_memory(e: BaseException) -> bool:
    """A device allocation that failed: torch's OutOfMemoryError, or a kernel library's own report of
    CUDA running out of memory (Triton raises `RuntimeError: Triton Error [CUDA]: out of memory` when a
    launch cannot get its memory)."""
    if type(e).__name__ == "OutOfMemoryError":
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and "out of memory" in text and ("CUDA" in text or "cuda" in text)


def describe(e: BaseException, first_line: bool = False) -> str:
    """`Type: message (file:line)` of an exception, for result rows; out-of-memory keeps its first line
    up to the sizes (what was asked, what is free, who holds the rest)."""
    text = str(e).strip()
    oom = out_of_memory(e)
    if first_line or oom:
        text = text.splitlines()[0] if text else ""
    if oom:  # the sizes, not torch's allocator advice and link
        for advice in (" If reserved but unallocated memory", " See documentation for Memory Management"):
            text = text.split(advice, 1)[0]
        return f"{OUT_OF_MEMORY}{text}"
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {text}{where}".strip()
