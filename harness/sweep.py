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
from attnbench.errors import AttnbenchError, describe
from attnbench.pool import Pool
from attnbench.results import Result, ResultWriter, read_results
from attnbench.runner import ContextLost, RunOptions, error_row, run_case, triage
from attnbench.suite import MAX_CASES, Suite, load
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
        lines = [
            f"{len(self.cases)} cases x {len(self.backends)} backends ({', '.join(b.name for b in self.backends)})"
        ]
        lines += [f"  {suite}/{op}: {n}" for (suite, op), n in sorted(by.items())]
        return "\n".join(lines)


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """`K/N` (1-based) -> (K, N)."""
    if not text:
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise AttnbenchError(f"--shard takes K/N (e.g. 2/4), got {text!r}") from None
    if not 1 <= k <= n:
        raise AttnbenchError(f"--shard {text}: K must be between 1 and N")
    return k, n


def parse_gpus(text: str | None, device: str) -> list[str]:
    """`all` or `0,1,...` -> worker devices; default: the run device alone.

    A GPU may be named more than once (`0,0,0,0`): several workers then share it, which suits a
    correctness-only pass (`--no-timing`) that fills JIT caches in parallel; their timings overlap.
    """
    if not text:
        return [device]
    if not device.startswith("cuda"):
        raise AttnbenchError("--gpus needs a CUDA device")
    count = torch.cuda.device_count()
    ids = list(range(count)) if text == "all" else []
    if text != "all":
        try:
            ids = [int(x) for x in text.split(",")]
        except ValueError:
            raise AttnbenchError(f"--gpus takes all or a list like 0,1, got {text!r}") from None
    bad = [i for i in ids if not 0 <= i < count]
    if bad or not ids:
        raise AttnbenchError(f"--gpus {text}: this machine has GPUs 0..{count - 1}")
    return [f"cuda:{i}" for i in ids]


def plan(
    suite_names: list[str],
    device: str = "auto",
    backends: list[str] | None = None,
    ops: list[str] | None = None,
    keywords: list[str] | None = None,
    case_ids: list[str] | None = None,
    shard: tuple[int, int] | None = None,
    max_cases: int = MAX_CASES,
) -> Plan:
    """Validate everything before anything is written: suites, backend names, filters.

    A suite expanding into more than `max_cases` cases is refused before it is expanded."""
    device = resolve_device(device)
    names = suite_names or ([] if case_ids else default_suites(device))
    suites = [load(n, device, max_cases) for n in names]
    cases = [c for s in suites for c in s.cases]
    if case_ids:
        cases += [_case_from_id(i, device) for i in case_ids]
    if ops:
        cases = [c for c in cases if c.op_name in ops]
    if keywords:
        cases = [c for c in cases if any(k in c.id for k in keywords)]
    if shard:  # deterministic: every N-th case of the full, ordered selection
        k, n = shard
        cases = cases[k - 1 :: n]
    registered = all_backends()
    chosen = [get_backend(b) for b in backends] if backends else list(registered.values())
    allowed = {b for s in suites if s.spec.backends for b in s.spec.backends}
    if allowed and not backends:
        chosen = [b for b in chosen if b.name in allowed]
    return Plan(device, suites, cases, chosen, {"backends": backends, "ops": ops, "k": keywords, "shard": shard})


def _case_from_id(case_id: str, device: str) -> Case:
    try:
        return Case.from_id(case_id, device)
    except (ValueError, AttnbenchError) as e:
        raise AttnbenchError(f"cannot parse case id {case_id!r}: {e}") from None


def default_out(p: Plan) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    names = "+".join(s.name.replace("/", "-") for s in p.suites) or "cases"
    return Path("reports") / f"{stamp}-{names}"


@dataclass(frozen=True)
class Execution:
    """How to run a plan: in crash-isolated workers (default) or in this process."""

    isolate: bool = True
    devices: tuple[str, ...] = ()  # worker devices; default: the plan's device
    timeout_s: float = 900.0  # per case, in a worker
    plugins: tuple[str, ...] = ()
    resume: bool = False
    sanitize: str | None = None  # a compute-sanitizer tool: one worker per (case, backend) under it, no timing
    sanitizer: str = "compute-sanitizer"  # its executable (sanitizer.locate())


def sample_per_op(cases: list[Case], n: int) -> list[Case]:
    """At most `n` cases per op, spread evenly over each op's cases (first and last kept), in order."""
    by_op: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        by_op.setdefault(c.op_name, []).append(i)
    keep: set[int] = set()
    for idx in by_op.values():
        if n <= 0 or len(idx) <= n:
            keep.update(idx)
        elif n == 1:
            keep.add(idx[0])
        else:
            keep.update(idx[round(j * (len(idx) - 1) / (n - 1))] for j in range(n))
    return [c for i, c in enumerate(cases) if i in keep]


def execute(
    p: Plan,
    out: Path,
    opts: RunOptions,
    on_rows: Callable[[Case, list[Result]], None] | None = None,
    argv: list[str] | None = None,
    how: Execution = Execution(),
    on_problem: Callable[[str], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> list[Result]:
    """Run the plan into `out`; rows reach `on_rows` and results.jsonl as they are produced.

    Backends' batched compilation (`Backend.precompile`) runs first, inside the run's wall time.

    With `resume`, rows already in `out/results.jsonl` are kept and their (case, backend) pairs are
    not run again; everything without a row is. With `sanitize`, nothing is timed (and no peaks measured).
    """
    if how.sanitize:
        if not how.isolate:
            raise AttnbenchError("--sanitize runs kernels in worker processes; it cannot be combined with --no-isolate")
        opts = replace(opts, timing=False)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    earlier = read_results(results) if how.resume and results.exists() else []
    done = {(r.case_id, r.backend) for r in earlier}
    if not how.resume and results.exists():
        results.unlink()  # a fresh run into an old directory starts clean
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
        "devices": list(how.devices or (p.device,)),
        "suites": [str(s.path) for s in p.suites],
        "backends": [b.name for b in p.backends],
        "filters": p.filters,
        "timing": opts.timing,
        "isolated": how.isolate,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if earlier:
        old = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
        run_info["resumed"] = old.get("resumed", []) + [{"started": old.get("started"), "rows_kept": len(earlier)}]
    if how.sanitize:
        run_info["sanitize"] = {"tool": how.sanitize, "executable": how.sanitizer, "cases": len(p.cases),
                                **p.filters.get("sanitize", {})}  # fmt: skip
    (out / "run.json").write_text(json.dumps(run_info, indent=2))
    jobs = [(c, [b.name for b in p.backends if (c.id, b.name) not in done]) for c in p.cases]
    jobs = [(c, names) for c, names in jobs if names]
    rows: list[Result] = list(earlier)
    t0 = time.perf_counter()
    try:
        if records := precompile(p.backends, jobs, on_status):
            run_info["precompile"] = records
            for r in records:
                if "error" in r and on_problem:
                    on_problem(
                        f"precompile for {', '.join(r['backends'])} failed ({r['error']}); each case compiles its own"
                    )
            (out / "run.json").write_text(json.dumps(run_info, indent=2))
        with ResultWriter(results) as writer:

            def record(case: Case, case_rows: list[Result]) -> None:
                for r in case_rows:
                    writer.append(r)
                rows.extend(case_rows)
                if on_rows:
                    on_rows(case, case_rows)

            if how.sanitize:
                _sanitized(jobs, p, opts, how, envmod.short(environment), record, out, on_problem)
            elif how.isolate:
                pool = Pool(list(how.devices or (p.device,)), opts, record, plugins=list(how.plugins),
                            timeout_s=how.timeout_s, log_dir=out / "logs", on_problem=on_problem)  # fmt: skip
                pool.run(jobs)
            else:
                _in_process(jobs, p, opts, envmod.short(environment), record)
        run_info["complete"] = True
    except BaseException as e:  # say in run.json why the sweep stopped (Ctrl-C, a harness error)
        run_info["stopped_by"] = describe(e, first_line=True) if isinstance(e, Exception) else type(e).__name__
        raise
    finally:  # the report states the run's wall time (and whether it finished)
        run_info |= {"finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "wall_s": round(time.perf_counter() - t0, 3)}
        run_info.setdefault("complete", False)
        (out / "run.json").write_text(json.dumps(run_info, indent=2))
    return rows


def precompile(backends: list[Backend], jobs: list[tuple[Case, list[str]]], on_status=None) -> list[dict]:
    """Run each backend family's batched `precompile` once over the keys its members need for `jobs`.

    Backends sharing one `precompile` method (e.g. the variants of a library) are built together.
    Returns one record per family: backends, number of keys, seconds, and its summary or error.
    """
    families: dict[object, tuple[type, list[str], dict]] = {}
    for b in backends:
        if b.available() is not None:
            continue
        try:  # a plugin that raises here is reported by the cases themselves
            cases = [c for c, names in jobs if b.name in names and b.supports(c) is None]
            keys = b.precompile_keys(cases) if cases else []
        except Exception:
            continue
        if keys:
            cls, names, found = families.setdefault(type(b).precompile.__func__, (type(b), [], {}))
            names.append(b.name)
            found.update(dict.fromkeys(keys))
    records = []
    for cls, names, found in families.values():
        if on_status:
            on_status(f"precompiling {len(found)} items for {', '.join(names)}")
        t0 = time.perf_counter()
        rec: dict = {"backends": names, "keys": len(found)}
        try:
            rec["summary"] = cls.precompile(list(found))
        except Exception as e:  # prepare compiles what it needs on its own
            rec["error"] = describe(e, first_line=True)
        rec["s"] = round(time.perf_counter() - t0, 3)
        records.append(rec)
    return records


def _sanitized(jobs, p: Plan, opts: RunOptions, how: Execution, env: dict, record, out: Path, on_problem) -> None:
    """Skips decided here; every (case, backend) that runs gets its own worker under the sanitizer."""
    from attnbench import sanitizer

    by_name = {b.name: b for b in p.backends}
    single = []
    for case, names in jobs:
        rows, todo = triage(case, [by_name[n] for n in names], env)
        if rows:
            record(case, list(rows.values()))
        single += [(case, [b.name]) for b in todo]
    pool = Pool(list(how.devices or (p.device,)), opts, record, plugins=list(how.plugins), timeout_s=how.timeout_s,
                log_dir=out / "logs", on_problem=on_problem, wrapper=sanitizer.command(how.sanitize, how.sanitizer),
                extra_env=sanitizer.WORKER_ENV, one_job_per_worker=True, review=sanitizer.review(how.sanitize))  # fmt: skip
    pool.run(single)


def _in_process(jobs, p: Plan, opts: RunOptions, env: dict, record) -> None:
    by_name = {b.name: b for b in p.backends}
    lost = ""
    for case, names in jobs:
        if lost:
            record(case, [error_row(case, n, f"not run: the CUDA context was lost earlier ({lost})") for n in names])
            continue
        try:
            record(case, run_case(case, [by_name[n] for n in names], opts, env))
        except ContextLost as e:
            lost = e.reason
            got = {r.backend for r in e.rows}
            record(
                case,
                e.rows
                + [error_row(case, n, f"not run: CUDA context lost ({e.reason})") for n in names if n not in got],
            )


def merge(runs: list[Path], out: Path) -> list[Result]:
    """Combine run directories (shards) into one: rows concatenated, a (case, backend) pair once."""
    seen: dict[tuple[str, str], Path] = {}
    rows: list[Result] = []
    envs = []
    for run in runs:
        path = Path(run) / "results.jsonl"
        if not path.is_file():
            raise AttnbenchError(f"{run}: no results.jsonl here")
        for r in read_results(path):
            key = (r.case_id, r.backend)
            if key in seen:
                raise AttnbenchError(f"{r.case_id} [{r.backend}] is in both {seen[key]} and {run}: runs overlap")
            seen[key] = Path(run)
            rows.append(r)
        env_path = Path(run) / "env.json"
        envs.append(json.loads(env_path.read_text()) if env_path.is_file() else {})
    out.mkdir(parents=True, exist_ok=True)
    with ResultWriter(out / "results.jsonl") as w:
        for r in rows:
            w.append(r)
    merged_env = dict(envs[0]) if envs else {}
    if len({e.get("host") for e in envs}) > 1 or len({e.get("gpu") for e in envs}) > 1:
        merged_env["merged_from"] = [{k: e.get(k) for k in ("host", "gpu", "device")} for e in envs]
    (out / "env.json").write_text(json.dumps(merged_env, indent=2))
    (out / "run.json").write_text(json.dumps({"merged": [str(r) for r in runs], "rows": len(rows)}, indent=2))
    return rows


def exit_code(rows: list[Result]) -> int:
    return 1 if any(r.status in ("fail", "error") for r in rows) else 0
