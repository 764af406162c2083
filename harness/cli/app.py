"""The `attnbench` command line: thin Typer commands over the services in run/sweep.py, report/ and plan/suite.py.

Exit codes: 0 every row passed, skipped or failed as expected (xfail); 1 a row failed, errored or
passed against an expectation (xpass); 2 bad usage or an invalid suite or expectations file (the
message names file:line and what is wrong; nothing is written).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape as esc
from rich.table import Table

from attnbench import backend as backend_mod  # no torch: --help and --version start fast
from attnbench.cli.progress import SweepProgress, make_console, widen
from attnbench.errors import AttnbenchError

app = typer.Typer(
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=False,
    add_completion=False,
    help="Benchmark and validate LLM attention kernels against float64 references.",
)


def _print_version(value: bool) -> None:
    if value:
        from attnbench import __version__

        print(f"attnbench {__version__}")
        raise typer.Exit()


list_app = typer.Typer(help="List suites, ops, backends (capability matrix) and model presets.")
app.add_typer(list_app, name="list")
trace_app = typer.Typer(help="Traces of served batches (docs/trace.md): import them from other tools.")
app.add_typer(trace_app, name="trace")
cache_app = typer.Typer(
    help="The reference cache (float64 references) and the compile caches kept between runs (docs/measurement.md)."
)
app.add_typer(cache_app, name="cache")
console = make_console(stderr=True)
out_console = make_console(stderr=False)


@app.callback()
def _setup(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Consoles that are not terminals (CI logs, pipes) get wide lines: nothing a user copies is broken.

    (One callback per app: Typer keeps only the last one, so the global options live here too.)
    """
    widen(console)
    widen(out_console)


def _fail(e: Exception) -> None:
    console.print(f"[bold red]error:[/] {esc(str(e))}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _enable_faulthandler() -> None:
    """A fatal signal in the supervisor still leaves a Python traceback on stderr (when it is a file)."""
    try:
        faulthandler.enable()
    except (AttributeError, ValueError, OSError):  # stderr without a file descriptor (captured)
        pass


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _stop_on_signals() -> None:
    """SIGINT (Ctrl-C) and SIGTERM (a CI job cancelled, `kill`) both stop a sweep the same way: what
    finished is kept and reported. SIGINT is re-armed because shells start background jobs with it ignored."""
    try:
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread (e.g. called from a test runner's thread)
        pass


def _load_backends(plugins: list[str] | None) -> None:
    """Built-in, installed (entry points) and named backends (attnbench.run.session.load_backends). A plugin
    the user named that does not load is an error (exit 2); an installed one that does not load is a
    warning, printed once."""
    from attnbench.run.session import load_backends

    for problem in load_backends(tuple(plugins or ())):
        console.print(f"[yellow]warning:[/] {esc(problem)}", highlight=False, soft_wrap=True)


@app.command()
def sweep(
    suites: Annotated[
        list[str] | None,
        typer.Argument(help="Suite names or YAML paths. Default: smoke on a CPU, the GPU suites on a GPU."),
    ] = None,
    backend: Annotated[
        list[str] | None,
        typer.Option("--backend", "-b", help="Only these backends (repeatable; 'flashinfer*' patterns too)."),
    ] = None,
    op: Annotated[list[str] | None, typer.Option("--op", help="Only these ops (repeatable).")] = None,
    keyword: Annotated[
        list[str] | None, typer.Option("-k", help="Only cases whose id contains this (repeatable).")
    ] = None,
    case: Annotated[
        list[str] | None,
        typer.Option(
            "--case", help="Run this case id (repeatable; added to the suites' cases: -k picks cases of a suite)."
        ),
    ] = None,
    trace: Annotated[
        list[str] | None,
        typer.Option(
            help="Replay the batches of this JSONL trace, a file or built-in name (repeatable; docs/trace.md). "
            "With --case it only resolves the ids of its batches."
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    out: Annotated[Path | None, typer.Option(help="Run directory. Default: reports/<time>-<suites>.")] = None,
    plugin: Annotated[
        list[str] | None, typer.Option(help="Import backends from this file or module (repeatable).")
    ] = None,
    timing: Annotated[
        bool | None,
        typer.Option(
            "--timing/--no-timing",
            help="Time the kernels (off: correctness only). Default: on with a GPU; on a CPU off, since host-clock "
            "times are never ranked or compared.",
            show_default=False,
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Keep the rows already in --out; run only what has none.")
    ] = False,
    shard: Annotated[str | None, typer.Option(help="Run shard K of N (K/N, 1-based) of the selected cases.")] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            help="One worker per GPU: all, or a list like 0,1; a GPU named twice (0,0) gets two workers, "
            "and a row that runs out of memory beside another worker runs again alone at the end."
        ),
    ] = None,
    isolate: Annotated[
        bool, typer.Option("--isolate/--no-isolate", help="Run cases in worker processes (crash isolation).")
    ] = True,
    timeout: Annotated[float, typer.Option(help="Seconds a case may take in a worker before it is killed.")] = 900.0,
    sanitize: Annotated[
        str | None,
        typer.Option(
            help="Run the kernels under compute-sanitizer: memcheck, racecheck, initcheck or synccheck (no timing; one worker per case and backend)."
        ),
    ] = None,
    sanitize_max: Annotated[
        int, typer.Option(help="With --sanitize: at most this many cases per op, spread over the suite (0: all).")
    ] = 4,
    expect: Annotated[
        list[Path] | None,
        typer.Option(help="Expected failures (YAML, repeatable): covered fails become xfail, passes xpass."),
    ] = None,
    no_expect: Annotated[
        bool,
        typer.Option("--no-expect", help="Apply no expectations (built-in, suites', --expect): every fail counts."),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would run (counts, then every case id) and exit.")
    ] = False,
    require: Annotated[
        str | None,
        typer.Option(help="Comma list of deterministic, batch_invariant: a backend lacking one fails its rows."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the run already in --out (default: refuse).")
    ] = False,
    max_cases: Annotated[
        int, typer.Option(help="Refuse a suite that expands into more cases than this (before expanding it).")
    ] = 10_000,
    precompile_only: Annotated[
        bool,
        typer.Option(
            "--precompile-only", help="Only build what the selected cases need (FlashInfer JIT), say how long, exit."
        ),
    ] = False,
    allow_skipped: Annotated[
        bool,
        typer.Option(
            "--allow-skipped",
            help="Do not fail a run where every row skipped, or where a backend named with -b skipped every case.",
        ),
    ] = False,
    replay: Annotated[
        bool,
        typer.Option(
            "--replay/--no-replay",
            help="CUDA-graph replay check (GPU rows of graph-captured ops whose backend declares itself graph-safe): "
            "capture on the case's batch, replay on another of the same shapes, check (docs/replay.md).",
        ),
    ] = True,
    ref_cache: Annotated[
        str | None,
        typer.Option(
            "--ref-cache",
            help="Reference cache directory, or off (default: $ATTNBENCH_REF_CACHE, else ~/.cache/attnbench/refs).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run suites: check every backend against float64 references, time it, write results and a report.

    Known failures (the built-in expectations, a suite's `expect:`, --expect files) become xfail and
    do not fail the run; an expected failure that passes is xpass and does (exit 1).
    """
    from attnbench.run.sweep import Selection, SweepOptions, parse_shard

    try:
        if expect and no_expect:
            raise AttnbenchError("--expect and --no-expect contradict each other")
        selection = Selection(
            suites=tuple(suites or ()), device=device, backends=tuple(backend or ()), ops=tuple(op or ()),
            keywords=tuple(keyword or ()), case_ids=tuple(case or ()), traces=tuple(trace or ()),
            shard=parse_shard(shard), max_cases=max_cases, expect_files=tuple(expect or ()), expect=not no_expect,
            require=tuple(_parse_require(require) or ()), plan_only=dry_run,
        )  # fmt: skip
    except AttnbenchError as e:
        _fail(e)
    _run_sweep(
        SweepOptions(
            selection,
            plugins=tuple(plugin or ()),
            out=out,
            timing=timing,
            resume=resume,
            overwrite=overwrite,
            gpus=gpus,
            isolate=isolate,
            timeout_s=timeout,
            sanitize=sanitize,
            sanitize_max=sanitize_max,
            ref_cache=ref_cache,
            dry_run=dry_run,
            precompile_only=precompile_only,
            allow_skipped=allow_skipped,
            replay=replay,
        )  # fmt: skip
    )


def _run_sweep(o) -> None:
    """`attnbench sweep` with its options (attnbench.run.sweep.SweepOptions): plan, run, report; exits."""
    from attnbench.run.runner import RunOptions
    from attnbench.run.session import Session
    from attnbench.run.sweep import parse_gpus
    from attnbench.store import refcache

    _enable_faulthandler()
    try:
        o.check()
        refs, max_refs = refcache.resolve(o.ref_cache), refcache.default_max_bytes()
        session = Session.open(o.selection, o.plugins)
        p = session.plan
        for w in session.warnings:
            console.print(f"[yellow]warning:[/] {esc(w)}", highlight=False, soft_wrap=True)
        devices = tuple(parse_gpus(o.gpus, p.device))
        p, sanitizer_exe = _sanitize_setup(p, o.sanitize, o.sanitize_max) if o.sanitize else (p, "")
    except AttnbenchError as e:
        _fail(e)
    if o.precompile_only:
        _precompile_only(p)
    if o.dry_run:
        _dry_run(p)
    if not p.cases:
        _fail(AttnbenchError("no cases selected (check --op / -k)"))
    timing = o.timing
    if timing is None:  # host-clock times are never ranked or compared: a CPU run checks correctness only
        timing = p.device.startswith("cuda")
        if not timing:
            console.print(f"correctness only on {p.device} (no GPU): nothing is timed; --timing times the kernels "
                          "with a host clock (shown, never ranked or compared)", highlight=False)  # fmt: skip
    opts = RunOptions(timing=timing, ref_cache=str(refs) if refs else None, ref_cache_max=max_refs, replay=o.replay)
    _execute_and_report(o, p, o.execution(devices, sanitizer_exe), opts)


def _execute_and_report(o, p, how, opts) -> None:
    """Run the plan `p` into the run directory, render the report, print the summary; exits."""
    from attnbench.report import render_all
    from attnbench.run.sweep import default_out, execute, exit_code
    from attnbench.store.results import read_results
    from attnbench.store.rundir import planned, prepare_run_dir

    run_dir = Path(os.path.abspath(o.out or default_out(p)))  # a plugin that changes directory moves nothing
    try:
        lock = prepare_run_dir(run_dir, planned(p, opts.timing), o.resume, o.overwrite)  # held until the process ends
    except AttnbenchError as e:
        _fail(e)
    console.print(f"[bold]attnbench[/] {p.breakdown().splitlines()[0]} on {p.device} -> {run_dir}", highlight=False)
    rows = []
    interrupted = False
    # rows, not cases: after a crash, or in sanitize mode, a case's rows arrive in several parts
    kept = len(read_results(run_dir / "results.jsonl")) if o.resume and (run_dir / "results.jsonl").exists() else 0
    with SweepProgress(console, len(p.cases) * len(p.backends), kept) as progress:

        def on_rows(c, case_rows):
            progress.rows(c.id, case_rows)

        _stop_on_signals()
        try:
            rows = execute(p, run_dir, opts, on_rows, argv=sys.argv, how=how,
                           on_problem=progress.problem, on_status=progress.status)  # fmt: skip
        except KeyboardInterrupt:
            interrupted = True
        except AttnbenchError as e:
            progress.stop()
            lock.close()
            _fail(e)
    rows = read_results(run_dir / "results.jsonl") if (run_dir / "results.jsonl").exists() else rows
    t_report = time.perf_counter()
    render_all(run_dir)
    _record_report_time(run_dir, time.perf_counter() - t_report)
    lock.close()  # the run directory is whole: another sweep may --resume or --overwrite it
    _print_summary(rows, complete=not interrupted)
    _print_notes(rows)
    _print_skipped(rows, list(o.selection.backends))
    _print_verdict(rows, json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {})
    _print_loosened(p.loosened())
    unverified = _print_unverified(rows, p.named_records(), o.allow_skipped)
    console.print(f"report: {run_dir / 'report.html'}", highlight=False)
    if interrupted:
        console.print("[yellow]interrupted: the report covers the cases that finished[/]")
        raise typer.Exit(130)
    raise typer.Exit(max(exit_code(rows), int(unverified)))


def _record_report_time(run_dir: Path, seconds: float) -> None:
    """run.json's costs.report_s: rendering the report comes after the wall time the report states, so
    a later `attnbench report` shows it (beside, not inside, the wall)."""
    from attnbench.store.runinfo import read_run, write_run

    try:
        info = read_run(run_dir)
        info.costs = dict(info.costs) | {"report_s": round(seconds, 3)}
        write_run(info, run_dir)
    except (OSError, AttnbenchError):
        pass  # the run is whole without it


def _dry_run(p) -> None:
    """The count breakdown, then every case id (one a line, whole) with its input size and least peak
    (harness/run/footprint.py), flagging cases that cannot fit the device's free memory; exit 0."""
    from attnbench.run.footprint import available, footprint, human

    out_console.print(p.breakdown(), highlight=False, markup=False)
    free = available(str(p.device))
    gpu_only = [s.name for s in p.suites if s.spec.device == "cuda" and not p.device.startswith("cuda")]
    if gpu_only:  # planned only: a sweep of them here is refused, and host memory says nothing about a GPU's
        free = None
        out_console.print(f"note: {', '.join(gpu_only)} {'is' if len(gpu_only) == 1 else 'are'} sized for a GPU: "
                          f"listed here, but a sweep on {p.device} refuses {'it' if len(gpu_only) == 1 else 'them'}",
                          highlight=False, markup=False)  # fmt: skip
    too_big = unsized = 0
    for c in p.cases:
        try:
            f = footprint(c, p.backends)
        except Exception as e:  # a plugin op's estimate: the listing goes on, the case says why it has no size
            unsized += 1
            out_console.print(f"  {c.id}  size unknown ({type(e).__name__}: {e})", highlight=False, markup=False)
            continue
        flag = ""
        if free is not None and f.peak > free[0]:
            too_big += 1
            flag = f"  DOES NOT FIT ({human(free[0])} free on {free[1]})"
        sizes = f"{human(f.inputs)} inputs, >= {human(f.peak)} with the {f.runs} backend(s) that run it"
        out_console.print(f"  {c.id}  {sizes}{flag}", highlight=False, markup=False)
    if unsized:
        out_console.print(f"{unsized} of {len(p.cases)} cases could not be sized", highlight=False, markup=False)
    if too_big:
        out_console.print(f"{too_big} of {len(p.cases)} cases do not fit: they would error out of memory",
                          highlight=False, markup=False)  # fmt: skip
    elif free is None:
        out_console.print(f"free memory on {p.device} unknown: no case checked against it", highlight=False)
    raise typer.Exit(0)


def _precompile_only(p) -> None:
    """Run the backends' batched precompile for the plan, print one line per family with its time, exit 0."""
    from attnbench.run.sweep import precompile

    records = precompile(p.backends, [(c, [b.name for b in p.backends]) for c in p.cases], lambda m: console.print(m))
    for r in records:
        what = f"failed ({r['error']}); each case compiles its own" if "error" in r else f"{r['keys']} items"
        out_console.print(f"precompile {', '.join(r['backends'])}: {what} in {r['s']:.1f} s", highlight=False)
    if not records:
        out_console.print("precompile: nothing to build for these cases and backends", highlight=False)
    raise typer.Exit(0)


def _sanitize_setup(p, tool: str, per_op: int):
    """Validate sanitize mode; the plan with its cases sampled (per op), and the sanitizer's path."""
    from dataclasses import replace

    from attnbench.run import sanitizer
    from attnbench.run.sweep import sample_per_op

    sanitizer.check_tool(tool)
    if not p.device.startswith("cuda"):
        raise AttnbenchError(
            f"--sanitize runs kernels under NVIDIA compute-sanitizer and needs a CUDA GPU (device: {p.device})"
        )
    exe = sanitizer.locate()
    total = len(p.cases)
    sampled = {"per_op": per_op, "sampled_from": total}
    p = replace(p, cases=sample_per_op(list(p.cases), per_op), filters={**p.filters, "sanitize": sampled})
    console.print(f"[bold]sanitize:[/] {tool} ({exe}), {len(p.cases)} of {total} cases (at most {per_op} per op), "
                  "no timing, one worker per case and backend", highlight=False)  # fmt: skip
    return p, exe


def _parse_require(text: str | None) -> list[str]:
    names = [t.strip() for t in (text or "").split(",") if t.strip()]
    bad = [n for n in names if n not in ("deterministic", "batch_invariant")]
    if bad:
        raise AttnbenchError(f"--require {', '.join(bad)}: expected deterministic and/or batch_invariant")
    return names


def _print_summary(rows, complete: bool = True) -> None:
    """Counts per backend and the verdict: the same numbers as summary.md and junit.xml (attnbench.store.counts)."""
    from attnbench.store.counts import STATUSES, count

    counts = count(rows)
    table = Table(title="summary", show_edge=False)
    for col in ("backend", *STATUSES):
        table.add_column(col, justify="right" if col != "backend" else "left")
    for name, c in counts.by_backend.items():
        table.add_row(esc(name), *(str(c[s]) for s in STATUSES))
    console.print(table)
    console.print(counts.verdict(complete), highlight=False)
    from attnbench.report.exports import determinism_warnings

    for line in determinism_warnings(rows):
        console.print(f"[yellow]warning[/] {esc(line)}", highlight=False)


def _print_verdict(rows, run: dict, limit: int = 10) -> None:
    """The first screen in the terminal, last: what broke (one line per cause with its row count and the
    first row's repro: identical failures collapse into one), then who is fastest per shape class."""
    from attnbench.report.firstscreen import fastest_cells, first_screen

    fs = first_screen(rows, run)
    if fs.broken:
        console.print("[bold]what broke[/] (rows per cause; repro of the first row)", highlight=False)
        for g in fs.broken[:limit]:
            console.print(f"  [red]{g.n} × {esc(g.backend)} {g.status}[/] {esc(g.summary)} ({esc(g.where())})",
                          highlight=False, soft_wrap=True)  # fmt: skip
            console.print(f"    {esc(g.repro)}", highlight=False, soft_wrap=True)
        if len(fs.broken) > limit:
            console.print(f"  … and {len(fs.broken) - limit} more causes (report.html, summary.md)", highlight=False)
    if fs.fastest:
        console.print("[bold]fastest[/] (≈: tied; time over the per-case best, geometric mean)", highlight=False)
        for f in map(fastest_cells, fs.fastest[:limit]):
            console.print(f"  {esc(f['cls'])}: {esc(f['best'])} {f['score']}, {esc(f['margin'])}", highlight=False,
                          soft_wrap=True)  # fmt: skip
        if len(fs.fastest) > limit:
            console.print(f"  … and {len(fs.fastest) - limit} more classes (summary.md)", highlight=False)


def _print_changes(cmp, limit: int = 30) -> None:
    """What changed, with sizes (base → new µs, Δ%), regressions first, then the plan difference and the
    spread of the rows judged the same (attnbench.report.changes)."""
    from attnbench.report.changes import text_lines

    console.print("[bold]what changed[/]", highlight=False)
    for text in text_lines(cmp, limit):
        style = "red" if text.split(" ", 1)[0] in ("broke", "slower", "xpass", "missing", "now") else "dim"
        console.print(f"  [{style}]{esc(text)}[/]", highlight=False, soft_wrap=True)


def _print_notes(rows) -> None:
    """What the counts do not say: timings that are not GPU timings."""
    from attnbench.report.ranking import GPU, timing_kinds

    for kind, n in timing_kinds(rows).items():
        if kind != GPU:
            console.print(f"[yellow]note:[/] {n} rows were timed with a {esc(kind)}: not GPU timings, never ranked "
                          "or compared", highlight=False)  # fmt: skip


def _print_loosened(tolerances: list[dict]) -> None:
    """Every tolerance a suite loosened, with its why: a reviewer sees what was relaxed."""
    from attnbench.report.firstscreen import loosened_line

    for t in tolerances:
        console.print(f"[yellow]loosened tolerance:[/] {esc(loosened_line(t))}", highlight=False, soft_wrap=True)


def _print_unverified(rows, named: list[dict], allowed: bool) -> bool:
    """Print why the run verified nothing, or nothing of a backend named with -b (attnbench.store.verified),
    once per backend with its skip reason (e.g. how to enable Triton's CPU interpreter). True when that
    fails the run (not `allowed`)."""
    from attnbench.store.verified import unverified

    lines = unverified(rows, named)
    for line in lines:
        head = "[yellow]note:[/]" if allowed else "[bold red]error:[/]"
        console.print(f"{head} {esc(line)}", highlight=False, soft_wrap=True)
    if lines and not allowed:
        console.print("(--allow-skipped accepts a run that skipped this)", highlight=False)
    return bool(lines) and not allowed


def _print_skipped(rows, named: list[str]) -> None:
    """One line per backend that ran nothing, with why (attnbench.report.skips); the backends the user named
    are left to _print_notes."""
    from attnbench.report.skips import skipped_backends

    said = {b.split(":", 1)[0] for b in named}
    lines = [s for s in skipped_backends(rows, backend_mod.all_backends()) if s.backend.split(":", 1)[0] not in said]
    if not lines:
        return
    width = max(len(s.backend) for s in lines)
    console.print(f"[yellow]skipped[/] {len(lines)} backend{'s' * (len(lines) > 1)} that ran nothing:", highlight=False)
    for s in lines:
        console.print(f"  {esc(s.backend.ljust(width))}  {esc(s.reason)}", highlight=False, soft_wrap=True)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run directory holding results.jsonl.")],
    baseline: Annotated[
        str | None, typer.Option(help="Backend that speedups are relative to (default: torch).")
    ] = None,
    against: Annotated[
        Path | None, typer.Option(help="A baseline run: its comparison (what changed) joins the first screen.")
    ] = None,
) -> None:
    """Re-render report.html, results.csv, junit.xml and summary.md from a run's results.jsonl."""
    from attnbench.report import render_all
    from attnbench.store.results import read_run_results, results_file

    if not run_dir.is_dir() or results_file(run_dir) is None:
        _fail(AttnbenchError(f"{run_dir}: no results.jsonl here (nor results.jsonl.gz)"))
    try:
        if baseline:
            names = sorted({r.backend for r in read_run_results(run_dir)})
            if baseline not in names:
                raise AttnbenchError(
                    f"--baseline {baseline!r} is not a backend of this run; it has: {', '.join(names)}"
                )
        if against is not None and results_file(against) is None:
            raise AttnbenchError(f"--against {against}: no results.jsonl here (nor results.jsonl.gz)")
        render_all(run_dir, baseline, against)
    except AttnbenchError as e:  # an unreadable results.jsonl or run.json: file:line and what is wrong
        _fail(e)
    from attnbench.store.verified import missing_in

    for line in missing_in(run_dir):  # the report's first screen says it too
        console.print(f"[yellow]warning:[/] {esc(str(run_dir))}: {esc(line)}", highlight=False, soft_wrap=True)
    out_console.print(f"{run_dir / 'report.html'}")


@app.command()
def merge(
    runs: Annotated[list[Path], typer.Argument(help="Run directories to combine (e.g. shards).")],
    out: Annotated[Path, typer.Option(help="The merged run directory (a new one).")],
    partial: Annotated[
        bool, typer.Option("--partial", help="Merge shards even when some of K/N are missing (marked incomplete).")
    ] = False,
) -> None:
    """Combine runs (shards of one sweep) into one run directory and report.

    Refuses an --out that is one of the runs, runs on different devices or of different timing modes,
    and (without --partial) an incomplete set of shards, naming the missing ones.
    """
    from attnbench.report import render_all
    from attnbench.run.sweep import exit_code
    from attnbench.run.sweep import merge as merge_runs
    from attnbench.store.runinfo import read_run

    try:
        rows = merge_runs(runs, out, partial=partial)
        render_all(out)
        info = read_run(out)
    except OSError as e:
        _fail(AttnbenchError(f"--out {out}: cannot write there ({e.strerror or e})"))
    except AttnbenchError as e:
        _fail(e)
    _print_summary(rows, complete=bool(info.complete))
    if info.missing_shards or info.stopped_by:
        missing = [f"shards {', '.join(info.missing_shards)} missing"] if info.missing_shards else []
        why = "; ".join(missing + ([info.stopped_by] if info.stopped_by else []))
        console.print(f"[yellow]incomplete merge:[/] {esc(why)}", highlight=False, soft_wrap=True)
    out_console.print(f"{out / 'report.html'}")
    raise typer.Exit(exit_code(rows))


@app.command()
def selftest(device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "cpu") -> None:
    """Run the built-in broken backends over the default suites: each must be caught, torch must pass."""
    from attnbench.cli import selftest as st
    from attnbench.run.sweep import resolve_device

    backend_mod.load_builtin()
    try:
        rep = st.run(resolve_device(device))
    except AttnbenchError as e:
        _fail(e)
    table = Table(title=f"attnbench selftest: mutants over {', '.join(rep.suites)}", show_edge=False)
    for col in ("mutant", "bug", "first case that caught it", "why it was flagged"):
        table.add_column(col)
    for o in rep.outcomes:
        where = o.case_id if o.caught else f"[red]not caught[/] {'; '.join(o.named_misses)}"
        if o.known_escape:
            where = (
                f"{o.case_id} (a known escape now caught: remove the mark)"
                if o.caught
                else f"known escape: {o.known_escape}"
            )
        table.add_row(o.mutant, esc(o.bug), esc(where), esc(o.reason[:110]))
    out_console.print(table)
    for cid, status, reason in rep.reference_failures:
        out_console.print(f"{rep.reference_backend} {status} on {cid}: {esc(reason[:200])}", highlight=False)
    out_console.print(
        f"mutation score {rep.caught}/{len(rep.outcomes)} = {rep.score:.2f} "
        f"{f'({rep.known_escapes} known escape(s), shown above) ' if rep.known_escapes else ''}"
        f"({rep.cases_run} cases run; {rep.reference_backend} passed "
        f"{'all' if not rep.reference_failures else f'all but {len(rep.reference_failures)}'})",
        highlight=False,
    )
    raise typer.Exit(0 if rep.ok else 1)


@app.command()
def compare(
    base: Annotated[Path, typer.Argument(help="The baseline run directory (or its results.jsonl).")],
    new: Annotated[Path, typer.Argument(help="The run to check against it.")],
    out: Annotated[Path | None, typer.Option(help="Where compare.html/.md/.json go. Default: NEW/compare.")] = None,
    min_change: Annotated[float, typer.Option(help="Smallest relative speed change that counts.")] = 0.03,
    cv_multiple: Annotated[float, typer.Option(help="A change must also exceed this many CVs.")] = 3.0,
    also: Annotated[
        list[Path] | None,
        typer.Option(
            "--also", help="Another baseline run (repeatable): the runs are pooled, so noise between runs counts."
        ),
    ] = None,
    allow_missing: Annotated[
        bool,
        typer.Option("--allow-missing", help="Rows of BASE that NEW lacks or now skips do not fail the gate."),
    ] = False,
) -> None:
    """The regression gate: exit 1 when a row broke (pass -> fail/error), got slower beyond noise, went
    missing or is now skipped (unless --allow-missing), or when nothing could be compared.

    Slower means: the 95% CIs of the two medians separate and the change exceeds max(min-change,
    cv-multiple x CV). With --also, the baseline pools several runs: median of medians, the hull of
    their CIs, CV at least the spread between them. Writes compare.html, compare.md and compare.json.
    """
    from attnbench.report.compare import GateRule, compare_runs
    from attnbench.report.comparison import write_comparison
    from attnbench.store.rundir import check_writable

    try:
        if not (min_change >= 0 and cv_multiple >= 0):
            raise AttnbenchError(f"--min-change and --cv-multiple must be >= 0, got {min_change:g} and {cv_multiple:g}")
        cmp = compare_runs([base, *(also or [])], new, GateRule(min_change, cv_multiple, allow_missing))
    except AttnbenchError as e:
        _fail(e)
    out = out or (new if new.is_dir() else new.parent) / "compare"
    try:
        check_writable(out)
        write_comparison(cmp, out)
    except OSError as e:
        _fail(AttnbenchError(f"--out {out}: cannot write there ({e.strerror or e})"))
    except AttnbenchError as e:
        _fail(e)
    counts = cmp.counts()
    table = Table(title=f"{cmp.base} -> {new}", show_edge=False)
    for col in ("verdict", "rows"):
        table.add_column(col)
    for verdict, n in counts.most_common():
        table.add_row(verdict, str(n))
    console.print(table)
    for w in cmp.env_warnings():
        console.print(f"[yellow]warning:[/] {esc(w)}", highlight=False)
    _print_changes(cmp)
    console.print(f"comparison: {out / 'compare.html'}", highlight=False, soft_wrap=True)
    from attnbench.store.verified import missing_in

    torn = [f"{run}: {why}" for run in (base, *(also or []), new) for why in missing_in(run)]
    for line in torn:  # rows absent from one side are not compared: the comparison is not whole
        console.print(f"[bold red]gate failed:[/] {esc(line)}", highlight=False, soft_wrap=True)
    if reason := cmp.nothing_compared():
        console.print(f"[bold red]gate failed:[/] {esc(reason)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    raise typer.Exit(1 if cmp.regressions or torn else 0)


@app.command()
def gate(
    run: Annotated[Path, typer.Argument(help="The run directory to judge.")],
    baseline: Annotated[
        list[Path] | None,
        typer.Option(help="A baseline run (repeatable; several are pooled). None: the run's own rows decide."),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Where gate.md/.json (and compare.*) go. Default: RUN/gate.")] = None,
    min_change: Annotated[float, typer.Option(help="Smallest relative speed change that counts.")] = 0.03,
    cv_multiple: Annotated[float, typer.Option(help="A change must also exceed this many CVs.")] = 3.0,
    allow_missing: Annotated[
        bool, typer.Option("--allow-missing", help="Rows missing or newly skipped against the baseline do not fail.")
    ] = False,
    allow_skipped: Annotated[
        bool,
        typer.Option(
            "--allow-skipped", help="Pass a run where every row skipped, or where a -b backend skipped every case."
        ),
    ] = False,
) -> None:
    """The CI verdict: exit 1 on an unfinished sweep, rows missing from results.jsonl, a run that ran
    nothing (or a -b backend that skipped everything), an xpass, or (against baselines) a row that broke
    or got slower; without a baseline on any fail or error. Writes gate.md for a job summary or PR comment."""
    from attnbench.report import gate as gate_mod
    from attnbench.report.compare import GateRule
    from attnbench.store.rundir import check_writable

    try:
        rule = GateRule(min_change, cv_multiple, allow_missing)
        g = gate_mod.decide(run, list(baseline or []), rule, allow_skipped=allow_skipped)
    except AttnbenchError as e:
        _fail(e)
    out = out or run / "gate"
    try:
        check_writable(out)
        gate_mod.write(g, out)
    except OSError as e:
        _fail(AttnbenchError(f"--out {out}: cannot write there ({e.strerror or e})"))
    except AttnbenchError as e:
        _fail(e)
    for reason in g.reasons:
        console.print(f"[red]gate:[/] {esc(reason)}", highlight=False)
    if g.comparison:
        _print_changes(g.comparison)
    else:
        _print_verdict(g.rows, g.run)
    out_console.print(f"gate: {g.verdict} ({out / 'gate.md'})", highlight=False)
    raise typer.Exit(0 if g.passed else 1)


@app.command()
def peaks(
    device: Annotated[str, typer.Option(help="cuda or cuda:N.")] = "cuda",
    refresh: Annotated[bool, typer.Option("--refresh", help="Measure again even if cached.")] = False,
) -> None:
    """Measured peak copy bandwidth and matmul TFLOP/s of a GPU (cached), beside its spec sheet."""
    import json

    from attnbench.run.peaks import get_peaks
    from attnbench.run.sweep import resolve_device

    try:
        dev = resolve_device(device)
    except AttnbenchError as e:
        _fail(e)
    if not dev.startswith("cuda"):
        _fail(AttnbenchError("peaks are measured on a CUDA device"))
    out_console.print_json(json.dumps(get_peaks(dev, refresh=refresh)))


@app.command()
def env(device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto") -> None:
    """Print the environment a run would record (machine, GPU, library versions)."""
    import json

    from attnbench.run.sweep import resolve_device
    from attnbench.store.env import capture

    try:
        out_console.print_json(json.dumps(capture(resolve_device(device))))
    except AttnbenchError as e:
        _fail(e)


@app.command()
def profile(
    case_id: Annotated[str, typer.Argument(metavar="CASE_ID", help="A case id, as rows and repro commands print it.")],
    backend: Annotated[
        list[str], typer.Option("--backend", "-b", help="Backends (repeatable). Default: every one.")
    ] = [],  # noqa: B006
    calls: Annotated[int, typer.Option(min=1, max=100, help="Closure calls inside the trace.")] = 3,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    trace: Annotated[list[str], typer.Option(help="Trace files that resolve replayed-batch ids.")] = [],  # noqa: B006
    plugin: Annotated[list[str], typer.Option(help="Import backends from this file or module.")] = [],  # noqa: B006
    out: Annotated[Path | None, typer.Option(help="Also write the markdown here.")] = None,
) -> None:
    """Show what each backend's timed closure launches on one case (torch.profiler: kernels, torch ops).

    A trace, not a benchmark (speed comes from `attnbench sweep`): prepare runs outside it, the closure
    once untraced, then --calls times traced; the table separates the adapter's torch ops from the library's.
    """
    from attnbench.plan.trace import case_from_id
    from attnbench.run.profile import profile_case, render
    from attnbench.run.sweep import resolve_device

    try:
        _load_backends(plugin)
        dev = resolve_device(device)
        case = case_from_id(case_id, dev, tuple(trace))
        chosen = backend_mod.select_backends(backend) if backend else list(backend_mod.all_backends().values())
    except (AttnbenchError, ValueError, KeyError) as e:
        _fail(e)
    if out is not None and out.is_dir():
        _fail(AttnbenchError(f"--out {out}: is a directory; --out names the markdown file to write"))
    text = render(case.id, profile_case(case, chosen, calls))
    out_console.print(text, markup=False, highlight=False)
    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        except OSError as e:
            _fail(AttnbenchError(f"--out {out}: cannot write there ({e.strerror or e})"))


_CACHE_DIR = typer.Option("--ref-cache", help="The cache directory (default: as sweep's, from the environment).")


def _cache_or_none(ref_cache: str | None):
    """The reference cache, or None (and a line saying so) when it is off."""
    from attnbench.store import refcache

    try:
        cache = refcache.open_cache(refcache.resolve(ref_cache))
    except AttnbenchError as e:
        _fail(e)
    if cache is None:
        out_console.print("the reference cache is off (--ref-cache off or $ATTNBENCH_REF_CACHE=off)", highlight=False)
    return cache


@cache_app.command("info")
def cache_info(ref_cache: Annotated[str | None, _CACHE_DIR] = None) -> None:
    """Where the reference cache is, how many references it holds, their size and the cap; then the
    compile caches under the cache root (compiled kernels kept between processes)."""
    from attnbench.cacheroot import COMPILE_CACHE_ENV, compile_caches, compile_caches_on

    cache = _cache_or_none(ref_cache)
    if cache is not None:
        entries = cache.entries()
        size = sum(st.st_size for _, st in entries)
        out_console.print(f"{cache.root}: {len(entries)} references, {size / 2**20:.1f} MiB of "
                          f"{cache.max_bytes / 2**30:g} GiB (least recently used go first)", highlight=False)  # fmt: skip
    if not compile_caches_on():
        out_console.print(f"compile caches are off (${COMPILE_CACHE_ENV}=off)", highlight=False)
    for d, files, size in compile_caches():
        out_console.print(f"{d}: {files} compiled files, {size / 2**20:.1f} MiB", highlight=False)


@cache_app.command("clear")
def cache_clear(
    ref_cache: Annotated[str | None, _CACHE_DIR] = None,
    also_compile: Annotated[
        bool, typer.Option("--compile", help="Also delete the compile caches under the cache root (compile/).")
    ] = False,
) -> None:
    """Delete every reference of the cache (only its entries: nothing else in the directory); with
    --compile, the compiled kernels kept under the cache root too."""
    from attnbench.cacheroot import cache_root, clear_compile_caches

    cache = _cache_or_none(ref_cache)
    if cache is not None:
        out_console.print(f"{cache.root}: {cache.clear()} references deleted", highlight=False)
    if also_compile:
        out_console.print(
            f"{cache_root() / 'compile'}: {clear_compile_caches()} compiled files deleted", highlight=False
        )


@trace_app.command("import")
def trace_import(
    files: Annotated[list[Path], typer.Argument(help="FlashInfer-Bench workload JSONL files.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The attnbench trace to write (JSONL).")],
    blobs: Annotated[
        Path | None, typer.Option(help="The dataset root holding blob/ (default: the files' folders and above).")
    ] = None,
    dtype: Annotated[str, typer.Option(help="The dtype of the replayed cases.")] = "bf16",
) -> None:
    """Convert FlashInfer-Bench workloads (paged GQA/MLA decode and prefill) into an attnbench trace.

    Per-request lengths come from the workloads' stored kv_indptr / qo_indptr / kv_last_page_len;
    workloads of definitions attnbench has no op for are counted and left out. Nothing is written
    unless every workload converts (else file:line, exit 2)."""
    from attnbench.dtypes import DTYPES
    from attnbench.plan.trace_import import import_files

    try:
        if dtype not in DTYPES:
            raise AttnbenchError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
        got = import_files(files, blobs, dtype)
        if not got.lines:
            left = ", ".join(f"{d} ({n})" for d, n in got.skipped.items()) or "no workload at all"
            raise AttnbenchError(f"nothing to write: no workload of a paged decode or prefill definition ({left})")
        tmp = output.with_name(output.name + ".tmp")
        tmp.write_text("".join(json.dumps(line) + "\n" for line in got.lines), encoding="utf-8")
        tmp.replace(output)
    except OSError as e:
        _fail(AttnbenchError(f"{output}: {e.strerror or e}"))
    except AttnbenchError as e:
        _fail(e)
    ops = Counter(line["op"] for line in got.lines)
    out_console.print(f"wrote {len(got.lines)} batches ({', '.join(f'{o} {n}' for o, n in ops.items())}) to {output}",
                      highlight=False)  # fmt: skip
    if got.skipped:
        left = ", ".join(f"{d} ({n})" for d, n in sorted(got.skipped.items()))
        out_console.print(f"left out (no attnbench op): {left}", highlight=False)


@list_app.command("suites")
def list_suites() -> None:
    """Built-in suites with their case counts."""
    from attnbench.plan.suite import builtin_names, load

    table = Table(show_edge=False)
    for col in ("suite", "device", "cases", "description"):
        table.add_column(col)
    for name in builtin_names():
        try:
            s = load(name, "cuda")  # listing only: the device check does not apply
            table.add_row(name, s.spec.device, str(len(s.cases)), " ".join(s.spec.description.split())[:90])
        except AttnbenchError as e:
            table.add_row(name, "?", "?", f"[red]{esc(str(e))}[/]")
    out_console.print(table)


@list_app.command("ops")
def list_ops(
    coverage: Annotated[
        bool, typer.Option("--coverage", help="The smoke suite's pairwise coverage: axes, pairs, forbidden pairs.")
    ] = False,
) -> None:
    """Ops and their parameters."""
    from attnbench.ops import OPS

    if coverage:
        from attnbench.ops.coverage import describe

        for name in OPS:
            out_console.print(esc(describe(name)), highlight=False, soft_wrap=True)
        return

    table = Table(show_edge=False)
    for col in ("op", "family", "parameters (default)"):
        table.add_column(col)
    for name, o in OPS.items():
        params = ", ".join(f"{k}={f.default!r}" for k, f in o.Params.model_fields.items())
        table.add_row(name, o.family, esc(params))
    out_console.print(table)


@list_app.command("models")
def list_models() -> None:
    """Model presets usable as `model:` in suites."""
    from attnbench.plan.suite import presets

    for name, fam in presets().items():
        out_console.print(f"[bold]{name}[/]: " + esc("; ".join(f"{k}: {v}" for k, v in fam.items())), highlight=False)


@list_app.command("backends")
def list_backends(
    suite: Annotated[str, typer.Option(help="Suite whose cases make the capability matrix.")] = "smoke",
    plugin: Annotated[list[str] | None, typer.Option(help="Import backends from this file or module.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
) -> None:
    """Backends, and the capability matrix (op x backend) over a suite with the skip reasons."""
    from attnbench.backend import all_backends
    from attnbench.plan.capability import matrix
    from attnbench.plan.suite import load
    from attnbench.run.sweep import resolve_device

    try:
        _load_backends(plugin)
        cases = load(suite, resolve_device(device)).cases
    except AttnbenchError as e:
        _fail(e)
    backends = list(all_backends().values())
    if not out_console.is_terminal:  # a pipe, a file, a CI log: one line per backend and op
        for line in _capability_lines(cases, backends, suite, resolve_device(device)):
            out_console.print(line, markup=False, highlight=False)
        return
    for b in backends:
        avail = b.available()
        state = "[green]available[/]" if not avail else f"[yellow]unavailable[/]: {esc(avail)}"
        out_console.print(f"[bold]{b.name}[/] ({', '.join(sorted(b.ops))}) {state}", highlight=False)
        if b.description:
            out_console.print(f"    {esc(b.description)}", highlight=False)
    table = Table(title=f"capability matrix over `{suite}` (supported/cases; why not)", show_edge=False)
    table.add_column("op / feature")
    for b in backends:
        table.add_column(b.name)
    for key, cells in matrix(cases, backends).items():
        table.add_row(esc(key), *[esc(c.text()) for c in cells])
    out_console.print(table)


def _capability_lines(cases, backends, suite: str, device: str) -> list[str]:
    """The capability matrix as plain aligned lines: backend, op, supported/cases, why not (the most
    common reason, or why the backend is unavailable)."""
    by_op: dict[str, list] = {}
    for c in cases:
        by_op.setdefault(c.op_name, []).append(c)
    table = [("backend", "op", "cases", "status")]
    for b in backends:
        unavailable = b.available()
        for op in sorted(b.ops):
            mine = by_op.get(op, [])
            if unavailable:
                table.append((b.name, op, f"0/{len(mine)}", f"unavailable: {unavailable}"))
                continue
            reasons: Counter[str] = Counter()
            for c in mine:
                try:
                    why = b.supports(c)
                except Exception as e:
                    why = f"supports() raised {type(e).__name__}: {e}"
                if why is not None:
                    reasons[why] += 1
            ok = len(mine) - sum(reasons.values())
            if not mine:
                status = f"no {op} cases in {suite}"
            elif not reasons:
                status = "supported"
            else:
                top, n = reasons.most_common(1)[0]
                more = f" (+{len(reasons) - 1} other reasons)" if len(reasons) > 1 else ""
                status = f"{len(mine) - ok} skipped: {top} ({n}){more}"
            table.append((b.name, op, f"{ok}/{len(mine)}", status))
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    head = f"capability matrix over `{suite}` on {device}: one line per backend and op"
    return [head] + ["  ".join(x.ljust(w) for x, w in zip(row[:3], widths)) + "  " + row[3] for row in table]


def main() -> None:
    try:
        app()
    except AttnbenchError as e:  # anything that escaped a command
        console.print(f"[bold red]error:[/] {esc(str(e))}", highlight=False)
        sys.exit(2)
