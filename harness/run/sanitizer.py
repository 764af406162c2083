"""Memory-safety mode (`attnbench sweep --sanitize TOOL`): workers under NVIDIA compute-sanitizer.

In this mode every (case, backend) pair runs in a worker process of its own, started under
`compute-sanitizer --tool TOOL`, so everything the sanitizer reports in that worker's log belongs to
that row (the inputs and the float64 reference are built in the same process: a finding in their
torch kernels would show up on every backend of the case, with torch's kernel name). A row with a
finding becomes `fail`, its reason names the tool, the kernel and the first reported access, and
the full log stays in the run directory (`logs/`).

The workers run with PyTorch's caching allocator off (every tensor its own cudaMalloc) and with
`--padding` bytes of unmapped space after every allocation, so a read one element past a tensor
is a read outside any allocation, which is what memcheck can see.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from attnbench.errors import AttnbenchError

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
PADDING_BYTES = 65536
PRINT_LIMIT = 20  # reports printed per worker; the summary still counts all of them
WORKER_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}

_PREFIX = "========= "
_NOT_FINDINGS = (
    "COMPUTE-SANITIZER",
    "ERROR SUMMARY",
    "LEAK SUMMARY",
    "RACECHECK SUMMARY",
    "Target application returned",
)


def locate() -> str:
    """Path of the compute-sanitizer executable: PATH, $CUDA_HOME/bin, next to nvcc, /usr/local/cuda/bin."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    dirs = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    candidates = (
        [Path(d) / "bin" for d in dirs if d] + ([Path(nvcc).parent] if nvcc else []) + [Path("/usr/local/cuda/bin")]
    )
    for d in candidates:
        exe = d / "compute-sanitizer"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    raise AttnbenchError(
        "--sanitize needs NVIDIA compute-sanitizer (part of the CUDA toolkit): not found on PATH, in "
        "$CUDA_HOME/bin, next to nvcc or in /usr/local/cuda/bin"
    )


def check_tool(tool: str) -> None:
    if tool not in TOOLS:
        raise AttnbenchError(f"--sanitize takes one of {', '.join(TOOLS)}, got {tool!r}")


def command(tool: str, executable: str) -> list[str]:
    """The wrapper put in front of each worker's command line."""
    check_tool(tool)
    cmd = [executable, "--tool", tool, "--print-limit", str(PRINT_LIMIT), "--report-api-errors", "no"]
    if tool == "memcheck":
        cmd += ["--padding", str(PADDING_BYTES)]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "all"]
    return cmd


@dataclass
class Finding:
    """One sanitizer report: its headline and the details of the first access it names."""

    headline: str
    kernel: str = ""
    thread: str = ""
    block: str = ""
    address: str = ""

    def summary(self) -> str:
        parts = [self.headline]
        if self.kernel:
            parts.append(f"in {self.kernel}")
        if self.thread or self.block:
            parts.append(f"thread {self.thread or '?'} block {self.block or '?'}")
        if self.address:
            parts.append(self.address)
        return ", ".join(parts)


_AT = re.compile(r"^at (?:0x[0-9a-f]+ in )?(?P<kernel>.+?)(?:\+0x[0-9a-f]+)?(?: in .*)?$")
_THREAD = re.compile(r"thread \((?P<t>[\d, ]+)\) in block \((?P<b>[\d, ]+)\)")


def parse(text: str) -> list[Finding]:
    """The device-side reports in a sanitizer log (other lines, the application's own, are ignored).

    A report starts with an unindented `========= ` line (e.g. `Invalid __global__ read of size 2
    bytes`, `Uninitialized __global__ memory read`, a racecheck `Error: Race reported ...` or
    hazard line, a synccheck `Barrier error ...`); its indented lines carry the kernel (`at K+0x..`),
    the thread and block, and the address.
    """
    findings: list[Finding] = []
    current: Finding | None = None
    for raw in text.splitlines():
        if not raw.startswith(_PREFIX.rstrip()):
            continue
        body = raw[len(_PREFIX) :] if raw.startswith(_PREFIX) else ""
        if not body.strip():
            current = None
            continue
        if not body.startswith(" "):  # a headline
            current = None
            if any(body.startswith(s) for s in _NOT_FINDINGS) or body.startswith("Program hit"):
                continue
            current = Finding(headline=body.strip().rstrip(":"))
            findings.append(current)
            continue
        if current is None:
            continue
        line = body.strip()
        m = _THREAD.search(line)
        if m and not current.thread:
            current.thread, current.block = f"({m['t'].replace(' ', '')})", f"({m['b'].replace(' ', '')})"
        elif line.startswith("at ") and not current.kernel:
            m = _AT.match(line)
            current.kernel = (m["kernel"] if m else line[3:]).strip()
        elif line.startswith("Address ") and not current.address:
            current.address = line
    return findings


def reason(tool: str, findings: list[Finding], log_name: str) -> str:
    """A row's reason for its findings: the tool, how many, the first one in full, where the log is."""
    n = len(findings)
    return f"{tool}: {n} finding{'s' * (n != 1)}, first: {findings[0].summary()}; log: logs/{log_name}"


def launch(tool: str, executable: str):
    """How the pool starts sanitize-mode workers: under the tool, a fresh worker per job, rows reviewed."""
    from attnbench.run.pool import WorkerLaunch

    return WorkerLaunch(
        wrapper=tuple(command(tool, executable)),
        env=tuple(WORKER_ENV.items()),
        fresh_per_job=True,
        review=review(tool),
    )


def review(tool: str):
    """The pool's per-job review in sanitize mode: findings in the job's worker log fail its rows."""

    def apply(rows: list, log: Path) -> list:
        text = log.read_text(errors="replace") if log.is_file() else ""
        findings = parse(text)
        for r in rows:
            if r.status == "skip":
                continue
            r.sanitizer = {"tool": tool, "findings": len(findings), "log": f"logs/{log.name}"}
            if findings:
                why = reason(tool, findings, log.name)
                r.reason = f"{why}; {r.reason}" if r.reason else why
                r.status = "fail"  # also an error row: the sanitizer stopping the kernel is what broke it
        return rows

    return apply
