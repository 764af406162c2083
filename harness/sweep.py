"""The sweep service behind `attnbench sweep`: select cases and backends, run, write the run directory.

A run directory holds `run.json` (what was asked), `env.json`, `results.jsonl` (row by row as
produced), and the rendered `report.html`, `results.csv`, `junit.xml`, `summary.md`.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from attnbench import env as envmod
from attnbench.backend import Backend, all_backends, get_backend
from attnbench.case import Case
from attnbench.errors import AttnbenchError
from attnbench.results import Result, ResultWriter
from attnbench.runner import RunOptions, run_case
from attnbench.suite import Suite, load
from attnbench.suites import CPU_DEFAULT, GPU_DEFAULT


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise AttnbenchError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AttnbenchError(f"device {device} requested but no CUDA GPU is visible")
    return str(dev)


def default_suites(device: str) -> list[str]:
    return GPU_DEFAULT if torch.device(device).type == "cuda" else CPU_DEFAULT


@dataclass
class Plan:
    """What a sweep will run: suites, cases (filtered, in order) and backends."""

    device: str
    suites: list[Suite]
    cases: list[Case]
    backends: list[Backend]
    filters: dict = field(default_factory=dict)

    def breakdown(self) -> str:
        by = Counter((c.suite, c.op_name) for c in self.cases)
        lines = [f"{len(self.cases)} cases x {len(self.backends)} backends ({', '.join(b.name for b in self.backends)})"]
        lines += [f"  {suite}/{op}: {n}" for (suite, op), n in sorted(by.items())]
        return "\n".join(lines)


def plan(
    suite_names: list[str],
    device: str = "auto",
    backends: list[str] | None = None,
    ops: list[str] | None = None,
    keywords: list[str] | None = None,
    case_ids: list[str] | None = None,
) -> Plan:
    """Validate everything before anything is written: suites, backend names, filters."""
    device = resolve_device(device)
    names = suite_names or ([] if case_ids else default_suites(device))
    suites = [load(n, device) for n in names]
    for s in suites:
        if s.spec.device == "cuda" and not device.startswith("cuda"):
            raise AttnbenchError(
                f"suite {s.name!r} is sized for a GPU (device: cuda in {s.path}); on a CPU run `smoke`, "
                "or give your own suite file"
            )
    cases = [c for s in suites for c in s.cases]
    if case_ids:
        cases += [_case_from_id(i, device) for i in case_ids]
    if ops:
        cases = [c for c in cases if c.op_name in ops]
    if keywords:
        cases = [c for c in cases if any(k in c.id for k in keywords)]
    registered = all_backends()
    chosen = [get_backend(b) for b in backends] if backends else list(registered.values())
    allowed = {b for s in suites if s.spec.backends for b in s.spec.backends}
    if allowed and not backends:
        chosen = [b for b in chosen if b.name in allowed]
    return Plan(device, suites, cases, chosen, {"backends": backends, "ops": ops, "k": keywords})


def _case_from_id(case_id: str, device: str) -> Case:
    try:
        return Case.from_id(case_id, device)
    except (ValueError, AttnbenchError) as e:
        raise AttnbenchError(f"cannot parse case id {case_id!r}: {e}") from None


def default_out(p: Plan) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    names = "+".join(s.name.replace("/", "-") for s in p.suites) or "cases"
    return Path("reports") / f"{stamp}-{names}"


def execute(
    p: Plan,
    out: Path,
    opts: RunOptions,
    on_rows: Callable[[Case, list[Result]], None] | None = None,
    argv: list[str] | None = None,
) -> list[Result]:
    """Run the plan into `out`; rows reach `on_rows` and results.jsonl as they are produced."""
    out.mkdir(parents=True, exist_ok=True)
    environment = envmod.capture(p.device)
    if opts.timing and opts.peaks is None and p.device.startswith("cuda"):
        from attnbench.peaks import get_peaks

        try:  # measured once per device and driver, then cached
            environment["peaks"] = get_peaks(p.device)
            opts = replace(opts, peaks=environment["peaks"])
        except Exception as e:
            environment["peaks_error"] = f"{type(e).__name__}: {e}"
    (out / "env.json").write_text(json.dumps(environment, indent=2))
    run_info = {
        "argv": argv if argv is not None else sys.argv,
        "device": p.device,
        "suites": [str(s.path) for s in p.suites],
        "backends": [b.name for b in p.backends],
        "filters": p.filters,
        "timing": opts.timing,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (out / "run.json").write_text(json.dumps(run_info, indent=2))
    short = envmod.short(environment)
    rows: list[Result] = []
    t0 = time.perf_counter()
    try:
        with ResultWriter(out / "results.jsonl") as writer:
            for case in p.cases:
                case_rows = run_case(case, p.backends, opts, short)
                for r in case_rows:
                    writer.append(r)
                rows += case_rows
                if on_rows:
                    on_rows(case, case_rows)
        run_info["complete"] = True
    finally:  # the report states the run's wall time (and whether it finished)
        run_info |= {"finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_s": time.perf_counter() - t0}
        run_info.setdefault("complete", False)
        (out / "run.json").write_text(json.dumps(run_info, indent=2))
    return rows


def exit_code(rows: list[Result]) -> int:
    return 1 if any(r.status in ("fail", "error") for r in rows) else 0
