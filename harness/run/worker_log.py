"""A worker's log with a cap: its first and last bytes are kept, what lies between is cut and counted.

A worker's stdout and stderr (kernel prints, a plugin's chatter, sanitizer reports) come through a
pipe that `CappedLog` drains on a thread: the first `head` bytes go to the file as they come, the last
`tail` bytes are held in memory, and at the end of the output one line says how many bytes were cut
between them, followed by the tail. A plugin printing 100 MB per call thus leaves a log of at most
`head + tail` bytes plus that line.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

HEAD_BYTES = 4 << 20  # kept from the start of a worker's output
TAIL_BYTES = 4 << 20  # kept from its end


class CappedLog:
    """Drain the read end `fd` of a pipe into `path`, keeping `head` and `tail` bytes (appending)."""

    def __init__(self, fd: int, path: Path, head: int = HEAD_BYTES, tail: int = TAIL_BYTES):
        self.path, self.head, self.tail = Path(path), head, tail
        self.cut = 0
        self._fd = fd
        self._thread = threading.Thread(target=self._drain, name=f"log {self.path.name}", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        written = 0
        held = bytearray()
        with open(self.path, "ab") as out:
            while chunk := _read(self._fd):
                room = max(0, self.head - written)
                if room:
                    out.write(chunk[:room])
                    out.flush()
                    written += min(room, len(chunk))
                    chunk = chunk[room:]
                if chunk:
                    held += chunk
                    if len(held) > self.tail:
                        self.cut += len(held) - self.tail
                        del held[: len(held) - self.tail]
            if self.cut:
                out.write(
                    f"\n[attnbench: {self.cut} bytes of worker output cut here; the log keeps the first "
                    f"{self.head} and the last {self.tail} bytes]\n".encode()
                )
            out.write(held)
        os.close(self._fd)

    def close(self, timeout: float = 10.0) -> None:
        """Wait until the output ended (every writer closed the pipe) and the file is complete."""
        self._thread.join(timeout)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return b""
