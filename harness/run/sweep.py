"""The sweep service behind `attnbench sweep`: select cases and backends, run, write the run directory.

A run directory holds `run.json` (what was asked), `env.json`, `results.jsonl` (row by row as
produced), and the rendered `report.html`, `results.csv`, `junit.xml`, `summary.md`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from attnbench.backend import Backend, all_backends, expand_backend_args, get_backend, is_pattern, select_backends
from attnbench.case import Case
from attnbench.errors import AttnbenchError, describe
from attnbench.plan import expectations
from attnbench.plan import trace as trace_mod
from attnbench.plan.expectations import Expectation
from attnbench.plan.suite import MAX_CASES, Suite, from_trace, load
from attnbench.run.executor import Execution, choose
from attnbench.run.runner import RunOptions
from attnbench.store import env as envmod
from attnbench.store.results import SCHEMA_VERSION, Result, ResultWriter, read_results, read_run_results, results_file
from attnbench.store.rundir import check_writable
from attnbench.store.runinfo import RunInfo, Shard, Source, git_info, read_run, write_run
from attnbench.store.verified import missing_rows
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


@dataclass(frozen=True)
class Plan:
    """What a sweep will run: suites, cases (filtered, in order) and backends. Immutable: a narrower
    plan is a new one (`dataclasses.replace(p, cases=...)`)."""

    device: str
    suites: tuple[Suite, ...]
    cases: tuple[Case, ...]
    backends: tuple[Backend, ...]
    filters: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    expectations: tuple[Expectation, ...] = ()  # those that apply (their versions match)
    expectations_off: int = 0  # loaded, but their versions do not match the installed libraries
    traces: tuple[str, ...] = ()  # replayed traces (built-in by name, else path): repro commands name them
    warnings: tuple[str, ...] = ()  # what is off about the user's expectations (unknown backend, no case...)
    named: tuple[tuple[str, tuple[str, ...]], ...] = ()  # each -b argument and the backends it selected

    def __post_init__(self):
        for name in ("suites", "cases", "backends", "expectations", "named"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "filters", MappingProxyType(dict(self.filters)))

    def verdicts(self, rows: list[Result]) -> list[Result]:
        """A case's rows with this plan's expectations applied: a covered fail becomes xfail, a covered
        row that passed xpass (the one place every entry point gets its verdicts from)."""
        return expectations.apply(rows, list(self.expectations))

    def named_records(self) -> list[dict[str, Any]]:
        """The -b arguments as run.json's `named_backends` records (attnbench.store.verified)."""
        return [{"arg": a, "pattern": is_pattern(a), "backends": list(names)} for a, names in self.named]

    def loosened(self) -> list[dict[str, Any]]:
        """The suites' own tolerances (a looser rule, each with its why), one record per suite, op and
        rule with its number of cases: run.json's `tolerances`, shown on the console and first screens."""
        from attnbench.check.tolerance import DEFAULT_FACTOR, DEFAULT_FLOOR

        found: dict[tuple, int] = {}
        for c in self.cases:
            if t := c.tolerance:
                factor = DEFAULT_FACTOR if t.factor is None else t.factor
                floor = DEFAULT_FLOOR if t.floor is None else t.floor
                key = (c.suite, c.op_name, factor, floor, t.why)
                found[key] = found.get(key, 0) + 1
        keys = ("suite", "op", "factor", "floor", "why")
        return [dict(zip(keys, key, strict=True)) | {"cases": n} for key, n in found.items()]

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


@dataclass(frozen=True)
class Selection:
    """What a run selects: the suites and cases, the backends, and the expectations that apply. Built by
    the CLI (`attnbench sweep`'s arguments), the pytest plugin (`--attnbench*`) and selftest; read by
    `plan` (Session.open). Every field is optional; `Selection()` is the default suites on `auto`.

    `traces` (`--trace`) replay their batches as suites do; with `case_ids` they are not run but
    resolve the ids of their cases (explicit lengths are named by digest: docs/trace.md).
    `plan_only` (`--dry-run`): a GPU suite is planned on a CPU device too; the plan is not run.
    """

    suites: tuple[str, ...] = ()  # names or YAML paths; () = the device's default suites
    device: str = "auto"
    backends: tuple[str, ...] = ()  # names or patterns (`-b`); () = every registered backend
    ops: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()  # `-k`: a case id contains one
    case_ids: tuple[str, ...] = ()
    traces: tuple[str, ...] = ()
    shard: tuple[int, int] | None = None  # (K, N), 1-based
    max_cases: int = MAX_CASES  # a suite expanding into more is refused before it is expanded
    expect_files: tuple[str, ...] = ()
    expect: bool = True  # apply expectations: the built-in ones, the suites' `expect:`, `expect_files`
    require: tuple[str, ...] = ()  # properties every backend must have on every case (`--require`)
    plan_only: bool = False


@dataclass(frozen=True)
class SweepOptions:
    """Everything `attnbench sweep` is asked, typed: what runs (`selection`, read by `plan`), how it runs
    (`execution()`, read by `execute`'s executors), what each case records (`run_options()`, read by
    the runner) and where the rows go (`out`, `resume`, `overwrite`). The CLI builds it from its flags."""

    selection: Selection = Selection()
    plugins: tuple[str, ...] = ()
    out: Path | None = None  # None: reports/<time>-<suites>
    timing: bool | None = None  # None: on with a GPU, off on a CPU
    resume: bool = False
    overwrite: bool = False
    gpus: str | None = None  # `all` or `0,1`: one worker per GPU named
    isolate: bool = True
    timeout_s: float = 900.0  # per case, in a worker
    sanitize: str | None = None  # a compute-sanitizer tool
    sanitize_max: int = 4  # with sanitize: cases per op (0: all)
    ref_cache: str | None = None  # a directory, `off`, or None: $ATTNBENCH_REF_CACHE, else the default
    dry_run: bool = False
    precompile_only: bool = False
    allow_skipped: bool = False
    replay: bool = True  # the CUDA-graph replay check (docs/replay.md)

    def check(self) -> None:
        """AttnbenchError (one line) for options that cannot go together or out of range."""
        if not self.timeout_s > 0:
            raise AttnbenchError(f"--timeout must be a positive number of seconds, got {self.timeout_s:g}")
        if self.selection.max_cases < 1:
            raise AttnbenchError(f"--max-cases must be at least 1, got {self.selection.max_cases}")
        if self.resume and self.out is None:
            raise AttnbenchError("--resume needs --out, the run directory to resume")

    def execution(self, devices: tuple[str, ...], sanitizer: str) -> Execution:
        """How the cases run: `devices` from `gpus` (parse_gpus), `sanitizer` the located executable."""
        return Execution(isolate=self.isolate, devices=devices, timeout_s=self.timeout_s, plugins=self.plugins,
                         resume=self.resume, sanitize=self.sanitize, sanitizer=sanitizer)  # fmt: skip


def plan(sel: Selection) -> Plan:
    """Validate everything before anything is written: suites, backend names, filters, expectations.

    A suite expanding into more than `sel.max_cases` cases is refused before it is expanded. Only
    expectations whose library versions match the installed ones apply.
    """
    backends, ops, keywords = list(sel.backends) or None, list(sel.ops) or None, list(sel.keywords) or None
    case_ids, shard, require, max_cases = list(sel.case_ids), sel.shard, list(sel.require), sel.max_cases
    traces, expect = list(sel.traces), sel.expect
    device = resolve_device(sel.device)
    names = list(sel.suites) or ([] if case_ids or traces else default_suites(device))
    suites = [load(n, device, max_cases, sel.plan_only) for n in names]
    replays = [from_trace(t, device, max_cases) for t in traces or ()]
    if not case_ids:
        suites += replays
    cases = [c for s in suites for c in s.cases]
    trace_files = list(dict.fromkeys(p for s in [*suites, *replays] for p in s.traces))
    if case_ids:
        cases += [_case_from_id(i, device, trace_files) for i in case_ids]
    cases = _once(cases)  # the same suite twice, or a --case twice, runs (and counts) once
    if ops:
        cases = [c for c in cases if c.op_name in ops]
    if keywords:
        cases = [c for c in cases if any(k in c.id for k in keywords)]
    if shard:  # deterministic: every N-th case of the full, ordered selection
        k, n = shard
        cases = cases[k - 1 :: n]
    if require:  # --require: properties every backend must have on every case (else its row fails)
        cases = [replace(c, require=c.require | frozenset(require)) for c in cases]
    registered = all_backends()
    named = [(spec, tuple(b.name for b in found)) for spec, found in expand_backend_args(backends or [])]
    chosen = select_backends(backends) if backends else list(registered.values())
    allowed = list(dict.fromkeys(b for s in suites if s.spec.backends for b in s.spec.backends))
    if allowed and not backends:  # the suites' backends, knob variants (`NAME:k=v`) included
        chosen = [get_backend(b) for b in allowed]
    mine = expectations.gather(suites, sel.expect_files, builtin_too=False) if expect else []
    loaded = expectations.builtin() + mine if expect else []
    applying = expectations.applicable(loaded)
    warned = expectations.warnings(mine, [c.id for c in cases], registered)
    filters = {"backends": backends, "ops": ops, "k": keywords, "shard": shard}
    filters |= {"require": sorted(require)} if require else {}
    labels = tuple(trace_mod.label(t) for t in trace_files)
    return Plan(device, suites, cases, chosen, filters, applying, len(loaded) - len(applying), labels, warned, named)


def _once(cases: list[Case]) -> list[Case]:
    """Cases without repeated ids, in order, the first occurrence of each kept."""
    first: dict[str, Case] = {}
    for c in cases:
        first.setdefault(c.id, c)
    return list(first.values())


def _case_from_id(case_id: str, device: str, traces: list[Path] = ()) -> Case:
    try:
        return trace_mod.case_from_id(case_id, device, traces)
    except (ValueError, AttnbenchError) as e:
        raise AttnbenchError(f"cannot parse case id {case_id!r}: {e}") from None


def default_out(p: Plan) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    names = "+".join(s.name.replace("/", "-") for s in p.suites) or "cases"
    return Path("reports") / f"{stamp}-{names}"


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
    how.check()
    t0 = time.perf_counter()  # the run's wall time starts here: set-up, precompile, cases, until the last row
    if how.sanitize:
        opts = replace(opts, timing=False)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    earlier = read_results(results) if how.resume and results.exists() else []
    done = {(r.case_id, r.backend) for r in earlier}
    if not how.resume and results.exists():
        results.unlink()  # a fresh run into an old directory starts clean
    environment = envmod.capture(p.device)
    if opts.timing and opts.peaks is None and p.device.startswith("cuda"):
        from attnbench.run.peaks import get_peaks

        try:  # measured once per device and driver, then cached
            environment["peaks"] = get_peaks(p.device)
            opts = replace(opts, peaks=environment["peaks"])
        except Exception as e:
            environment["peaks_error"] = f"{type(e).__name__}: {e}"
    (out / "env.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION} | environment, indent=2))
    shard = p.filters.get("shard")
    run_info = RunInfo(
        attnbench=environment.get("attnbench"),
        git=git_info(),
        argv=list(argv if argv is not None else sys.argv),
        device=p.device,
        devices=list(how.devices or (p.device,)),
        suites=[str(s.path) for s in p.suites],
        traces=list(p.traces),
        backends=[b.name for b in p.backends],
        named_backends=p.named_records(),
        tolerances=p.loosened(),
        plugins=list(how.plugins),
        filters=dict(p.filters),
        shard=Shard(k=shard[0], n=shard[1]) if shard else None,
        timing=opts.timing,
        executor=how.mode,
        isolated=how.isolate,
        started=time.strftime("%Y-%m-%dT%H:%M:%S"),
        expectations={"applied": sorted({e.where for e in p.expectations}), "not_applying": p.expectations_off},
    )
    if earlier:
        old = read_run(out)
        run_info.resumed = old.resumed + [{"started": old.started, "rows_kept": len(earlier)}]
    if how.sanitize:
        run_info.sanitize = {"tool": how.sanitize, "executable": how.sanitizer, "cases": len(p.cases),
                             **p.filters.get("sanitize", {})}  # fmt: skip
    write_run(run_info, out)
    jobs = [(c, [b.name for b in p.backends if (c.id, b.name) not in done]) for c in p.cases]
    jobs = [(c, names) for c, names in jobs if names]
    rows: list[Result] = list(earlier)
    # set-up: reading kept rows, the environment, peaks (measured once per device), git, run.json;
    # record: writing rows (fsynced) and showing progress, in this process
    costs: dict[str, float] = {"setup_s": time.perf_counter() - t0, "record_s": 0.0}

    def before_jobs() -> None:
        """The precompile, in this process, while the workers start (their imports overlap it)."""
        t1 = time.perf_counter()
        records = precompile(p.backends, jobs, on_status)
        # all of it: asking each backend available(), supports() and precompile_keys() over the cases
        # (a library's import, in this process) as well as the batched builds each record times
        costs["precompile_s"] = time.perf_counter() - t1
        if records:
            run_info.precompile = records
            for r in records:
                if "error" in r and on_problem:
                    on_problem(
                        f"precompile for {', '.join(r['backends'])} failed ({r['error']}); each case compiles its own"
                    )
            write_run(run_info, out)

    try:
        with ResultWriter(results) as writer:
            said_notes: set[str] = set()

            def record(case: Case, case_rows: list[Result]) -> None:
                t1 = time.perf_counter()
                case_rows = p.verdicts(case_rows)
                writer.extend(case_rows)
                rows.extend(case_rows)
                # each cache problem once a run (a full cache refuses every case's entry)
                for note in dict.fromkeys(r.reference_note for r in case_rows if r.reference_note):
                    if on_problem and note not in said_notes:
                        said_notes.add(note)
                        on_problem(note)
                if on_rows:
                    on_rows(case, case_rows)
                costs["record_s"] += time.perf_counter() - t1

            executor = choose(
                how, p.device, list(p.backends), opts, envmod.short(environment), out / "logs", on_problem
            )
            executor.run(jobs, record, before_jobs, costs)  # its costs accrue in `costs`, also when stopped
        run_info.complete = True
    except BaseException as e:  # say in run.json why the sweep stopped (Ctrl-C, a harness error)
        run_info.stopped_by = describe(e, first_line=True) if isinstance(e, Exception) else type(e).__name__
        raise
    finally:  # the report states the run's wall time (and whether it finished)
        run_info.finished = time.strftime("%Y-%m-%dT%H:%M:%S")
        # to the millisecond: the wall up, each cost down, so their rounding never makes "other" negative
        run_info.wall_s = math.ceil((time.perf_counter() - t0) * 1000) / 1000
        run_info.complete = bool(run_info.complete)
        run_info.rows = len(rows)
        run_info.references = reference_counts(rows[len(earlier) :], opts.ref_cache)
        run_info.costs = {k: math.floor(v * 1000) / 1000 for k, v in costs.items()}
        write_run(run_info, out)
    return rows


def reference_counts(rows: list[Result], cache: str | None) -> dict[str, Any]:
    """run.json's `references`: how many cases of these rows computed their reference and how many loaded it
    from the reference cache (a case split over two workers by a crash counts in each), the cache
    directory (or "off") and the cache problems met."""
    made = {(r.case_id, r.reference_from) for r in rows if r.reference_from}
    return {
        "computed": sum(src == "computed" for _, src in made),
        "from_cache": sum(src == "cache" for _, src in made),
        "cache": cache or "off",
        "problems": len({(r.case_id, r.reference_note) for r in rows if r.reference_note}),
    }


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


def merge(runs: list[Path], out: Path, partial: bool = False) -> list[Result]:
    """Combine run directories (shards) into one: rows concatenated, a (case, backend) pair once.

    A merge is complete only when every run finished and its results.jsonl holds every row its
    run.json recorded (attnbench.store.verified.missing_rows): a torn or emptied run is refused like a missing
    shard, and with `partial` merged but marked incomplete, `stopped_by` saying which rows are missing.

    Refused (AttnbenchError, nothing written): an output that is one of the inputs or already holds
    results; runs on different devices (device type and GPU/CPU model) or of different timing modes;
    shards of different N; missing shards of K/N (unless `partial`: then run.json names them and the
    merged run is marked incomplete). run.json has the same shape as a sweep's, with `merged_from`.
    """
    runs = [Path(r) for r in runs]
    if not runs:
        raise AttnbenchError("merge needs at least one run directory")
    out = Path(out)
    for run in runs:
        if not run.is_dir() or results_file(run) is None:
            raise AttnbenchError(f"{run}: no results.jsonl here (nor results.jsonl.gz)")
        if out.resolve() == run.resolve():
            raise AttnbenchError(f"--out {out} is one of the runs being merged; choose a new directory")
    if out.is_dir() and (held := results_file(out)) is not None:
        raise AttnbenchError(f"--out {out} already holds {held.name}; choose a new directory")
    infos = [read_run(run) for run in runs]
    envs = [_read_env(run) for run in runs]
    _same_device(runs, infos, envs)
    _same_timing(runs, infos)
    missing = _missing_shards(runs, infos)
    if missing and not partial:
        raise AttnbenchError(
            f"shard{'s' * (len(missing) > 1)} {', '.join(missing)} missing from the merge "
            "(pass --partial to merge what is there)"
        )
    seen: dict[tuple[str, str], Path] = {}
    rows: list[Result] = []
    sources = []
    torn: list[str] = []
    for run, info in zip(runs, infos, strict=True):
        got = read_run_results(run)
        torn += [f"{run}: {why}" for why in missing_rows(info.to_dict(), got)]
        if torn and not partial:
            raise AttnbenchError(f"{torn[0]} (pass --partial to merge what is there, marked incomplete)")
        for r in got:
            key = (r.case_id, r.backend)
            if key in seen:
                raise AttnbenchError(f"{r.case_id} [{r.backend}] is in both {seen[key]} and {run}: runs overlap")
            seen[key] = run
        rows += got
        if info.kind == "merge":  # a merge of merges lists the original runs
            sources += info.merged_from
        else:
            sources.append(Source(path=str(run), device=info.device, shard=info.shard, rows=len(got),
                                  complete=info.complete, git=info.git, kept=_kept_outside_wall(info, len(got))))  # fmt: skip
    check_writable(out)
    with ResultWriter(out / "results.jsonl") as w:
        w.extend(rows)
    merged_env = dict(envs[0])
    if len({e.get("host") for e in envs}) > 1 or len({e.get("gpu") for e in envs}) > 1:
        merged_env["merged_from"] = [{k: e.get(k) for k in ("host", "gpu", "device")} for e in envs]
    (out / "env.json").write_text(json.dumps(merged_env | {"schema_version": SCHEMA_VERSION}, indent=2))
    gits = {(i.git.commit, i.git.dirty, i.git.source) if i.git else None for i in infos}
    walls = [i.wall_s for i in infos if i.wall_s is not None]
    info = RunInfo(
        kind="merge",
        attnbench=envs[0].get("attnbench") or infos[0].attnbench,
        git=infos[0].git if len(gits) == 1 else None,  # differing commits or sources: see merged_from
        argv=list(sys.argv),
        device=infos[0].device,
        devices=list(dict.fromkeys(d for i in infos for d in (i.devices or [i.device] if i.device else []))),
        suites=list(dict.fromkeys(s for i in infos for s in i.suites)),
        traces=list(dict.fromkeys(t for i in infos for t in i.traces)),
        backends=list(dict.fromkeys(b for i in infos for b in i.backends)),
        named_backends=infos[0].named_backends
        if all(i.named_backends == infos[0].named_backends for i in infos)
        else [],
        plugins=list(dict.fromkeys(p for i in infos for p in i.plugins)),
        tolerances=_merged_tolerances(infos),
        filters=infos[0].filters if all(i.filters == infos[0].filters for i in infos) else {},
        timing=infos[0].timing,
        started=min((i.started for i in infos if i.started), default=None),
        finished=max((i.finished for i in infos if i.finished), default=None),
        wall_s=round(sum(walls), 3) if walls else None,  # machine time of all the runs together
        costs=_summed_costs(infos),  # the same: the wall breakdown of the merge is that of its runs together
        precompile=[r for i in infos for r in i.precompile],
        complete=not missing and not torn and all(i.complete is not False for i in infos),
        stopped_by="; ".join(torn) or None,  # a torn run's rows are missing: the gate says so
        merged_from=sources,
        missing_shards=missing,
        rows=len(rows),
    )
    write_run(info, out)
    return rows


def _kept_outside_wall(info: RunInfo, rows: int) -> int:
    """How many of a run's first rows its wall time does not hold: those a resumed sweep kept from its
    earlier processes, or every row of a run that recorded no wall time (report.measure.counted_rows)."""
    if info.wall_s is None:
        return rows
    kept = info.resumed[-1].get("rows_kept", 0) if info.resumed else 0
    return min(rows, kept) if isinstance(kept, int) else 0


def _summed_costs(infos: list[RunInfo]) -> dict[str, float]:
    """run.json `costs` of a merge: each item summed over the runs that recorded a wall time."""
    out: dict[str, float] = {}
    for info in infos:
        if info.wall_s is not None:
            for k, v in info.costs.items():
                out[k] = round(out.get(k, 0.0) + v, 3)
    return out


def _merged_tolerances(infos: list[RunInfo]) -> list[dict]:
    """The runs' loosened tolerances, one record per suite, op and rule, their cases added up."""
    found: dict[tuple, dict] = {}
    for info in infos:
        for t in info.tolerances:
            key = tuple(t.get(k) for k in ("suite", "op", "factor", "floor", "why"))
            rec = found.setdefault(key, dict(t) | {"cases": 0})
            rec["cases"] += t.get("cases", 0)
    return list(found.values())


def _read_env(run: Path) -> dict:
    path = run / "env.json"
    try:
        env = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (ValueError, UnicodeDecodeError) as e:
        raise AttnbenchError(f"{path}: not valid JSON ({e})") from None
    return env if isinstance(env, dict) else {}


def _device_of(run: Path, info: RunInfo, env: dict) -> str:
    """Device type and model: runs on `cuda:0` and `cuda:1` of the same GPU model are one device."""
    try:
        kind = torch.device(info.device).type if info.device else "?"
    except (RuntimeError, TypeError, ValueError):
        raise AttnbenchError(
            f"{run / 'run.json'}: unknown device {info.device!r} (expected cpu, cuda or cuda:N)"
        ) from None
    return f"{kind} ({env.get('gpu') or env.get('cpu') or 'unknown model'})"


def _same_device(runs: list[Path], infos: list[RunInfo], envs: list[dict]) -> None:
    found = [_device_of(r, i, e) for r, i, e in zip(runs, infos, envs, strict=True)]
    if len(set(found)) > 1:
        j = next(j for j, d in enumerate(found) if d != found[0])
        raise AttnbenchError(f"cannot merge runs on different devices: {runs[0]} ran on {found[0]}, "
                             f"{runs[j]} on {found[j]}")  # fmt: skip


def _timing_mode(run: Path, info: RunInfo) -> str:
    if info.timing is None:  # run.json from before versioning without it: the rows tell
        timed = any(r.timing for r in read_run_results(run))
    else:
        timed = info.timing
    return "timed" if timed else "untimed (correctness only)"


def _same_timing(runs: list[Path], infos: list[RunInfo]) -> None:
    modes = [_timing_mode(r, i) for r, i in zip(runs, infos, strict=True)]
    if len(set(modes)) > 1:
        j = next(j for j, m in enumerate(modes) if m != modes[0])
        raise AttnbenchError(f"cannot merge runs of different timing modes: {runs[0]} is {modes[0]}, "
                             f"{runs[j]} is {modes[j]}")  # fmt: skip


def _missing_shards(runs: list[Path], infos: list[RunInfo]) -> list[str]:
    """The shards K/N absent from a merge of sharded runs (empty when no run is a shard)."""
    have: dict[int, Path] = {}
    total = None
    for run, info in zip(runs, infos, strict=True):
        for s in info.shards():
            if total is not None and s.n != total:
                raise AttnbenchError(f"cannot merge shards of different splits: {run} holds shard {s}, "
                                     f"others are shards of {total}")  # fmt: skip
            total = s.n
            if s.k in have:
                raise AttnbenchError(f"runs overlap: shard {s} is in both {have[s.k]} and {run}")
            have[s.k] = run
    if total is None:
        return []
    return [f"{k}/{total}" for k in range(1, total + 1) if k not in have]


def exit_code(rows: list[Result]) -> int:
    """1 when a row fails the run (fail, error, xpass: `Status.is_failure`), else 0."""
    return 1 if any(r.status.is_failure for r in rows) else 0
