"""What a backend's timed closure launches: one case, each backend prepared as the sweep prepares it,
its closure called under `torch.profiler`, and the trace reduced to what ran inside the call.

This answers "does the timed window hold only the kernel?" (adapters hold stateful inputs in their
library's layout from `prepare` on and convert back in `finalize`, harness/backend.py): the table
lists every device kernel and every host-side torch op the closure ran, per call. It is a trace, not
a benchmark: times here are the profiler's, with its overhead; speed is measured by `attnbench
sweep` alone.

Contract of `profile_case(case, backends, calls)`: for each backend that supports the case, the
inputs are built once, copied per backend, `prepare` runs outside the trace, the closure is called
once untraced (first-use work such as JIT loads and autotuning stays out), then `calls` times inside
the trace; `finalize` is never traced. The result per backend is a `ClosureTrace`, or the reason the
backend did not run (unsupported, or the error `prepare` raised).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnbench.backend import Backend
from attnbench.buffers import clone_tensors
from attnbench.case import Case
from attnbench.errors import Unsupported

# torch ops that only describe or allocate memory (no data moves, no sync): not work outside the kernel
_VIEWS = {
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided", "aten::select",
    "aten::slice", "aten::t", "aten::transpose", "aten::permute", "aten::unsqueeze", "aten::squeeze",
    "aten::expand", "aten::unflatten", "aten::flatten", "aten::alias", "aten::detach", "aten::lift_fresh",
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resolve_conj", "aten::resolve_neg",
    "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::narrow",
}  # fmt: skip


@dataclass
class ClosureTrace:
    """What `calls` calls of one backend's closure ran: device kernels (name -> launches per call,
    profiler device µs per call) and host-side torch ops that are not views (name -> count per call)."""

    backend: str
    calls: int
    kernels: dict[str, tuple[float, float]] = field(default_factory=dict)
    host_ops: dict[str, float] = field(default_factory=dict)  # called from the adapter (attnbench's code)
    library_ops: dict[str, float] = field(default_factory=dict)  # called from inside the library

    @property
    def launches(self) -> float:
        return sum(n for n, _ in self.kernels.values())


def _caller_is_ours(event, ours: tuple[str, ...]) -> bool:
    """Whether the innermost Python frame above an aten op, torch's own frames aside, lies under
    `ours` (attnbench's package directories). Frames are the profiler's python-function events."""
    q = event.cpu_parent
    while q is not None:
        path = q.name.split("(", 1)[0]
        if q.name.startswith("aten::") or path.startswith(("torch/", "<built-in")):
            q = q.cpu_parent
            continue
        return str(Path(path).resolve()).startswith(ours)
    return False


def _top_level_ops(events) -> list:
    """aten ops called directly by Python code (not from inside another aten op)."""
    out = []
    spans = sorted(
        (e for e in events if e.name.startswith("aten::") and e.device_type == torch.autograd.DeviceType.CPU),
        key=lambda e: (e.time_range.start, -e.time_range.end),
    )
    end = -1
    for e in spans:
        if e.time_range.start >= end:  # not nested in the previous top-level op
            out.append(e)
            end = e.time_range.end
    return out


def trace_closure(name: str, fn, calls: int, device: str) -> ClosureTrace:
    """Call `fn` `calls` times under the profiler and reduce the trace to per-call counts."""
    from torch.profiler import ProfilerActivity, profile

    on_cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities, with_stack=True) as prof:
        for _ in range(calls):
            fn()
        if on_cuda:
            torch.cuda.synchronize(device)
    events = prof.events()
    kernels: dict[str, list[float]] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += e.device_time_total
    import attnbench
    import attnbench.kernels
    import attnbench.references

    root = tuple(
        str(Path(d).resolve()) for m in (attnbench, attnbench.kernels, attnbench.references) for d in m.__path__
    )
    ours: Counter = Counter()
    theirs: Counter = Counter()
    for e in _top_level_ops(events):
        if e.name not in _VIEWS:
            (ours if _caller_is_ours(e, root) else theirs)[e.name] += 1
    per_call = {k: (n / calls, us / calls) for k, (n, us) in kernels.items()}
    return ClosureTrace(
        name, calls, per_call, {k: n / calls for k, n in ours.items()}, {k: n / calls for k, n in theirs.items()}
    )


def profile_case(case: Case, backends: list[Backend], calls: int = 3) -> dict[str, ClosureTrace | str]:
    """Per backend: the trace of its closure on `case`, or why it did not run."""
    out: dict[str, ClosureTrace | str] = {}
    with torch.cuda.device(torch.device(case.device)) if case.on_cuda else contextlib.nullcontext():
        pristine = case.make_inputs()
        for b in backends:
            if (why := b.supports(case)) is not None:
                out[b.name] = f"skip: {why}"
                continue
            try:
                fn = b.prepare(case, clone_tensors(pristine))
                fn()  # first use (JIT load, autotune) stays out of the trace
                if case.on_cuda:
                    torch.cuda.synchronize(case.device)
                out[b.name] = trace_closure(b.name, fn, calls, case.device)
            except Unsupported as e:
                out[b.name] = f"skip: {e}"
            except Exception as e:  # noqa: BLE001 - one backend's failure is its row, not the command's
                out[b.name] = f"error: {type(e).__name__}: {str(e)[:300]}"
    return out


def render(case_id: str, traces: dict[str, ClosureTrace | str]) -> str:
    """A markdown report: per backend, the kernels and host ops of one closure call."""
    lines = [f"## What the timed closure runs: `{case_id}`", ""]
    for name, t in traces.items():
        if isinstance(t, str):
            lines += [f"### {name}", "", t, ""]
            continue
        verdict = (
            "no torch op called from attnbench's code"
            if not t.host_ops
            else f"{sum(t.host_ops.values()):g} torch op(s) called from attnbench's code"
        )
        lines += [
            f"### {name}: {t.launches:g} kernel launch(es) per call, {verdict}",
            "",
            "| kind | name | per call | profiler device µs per call |",
            "|---|---|---:|---:|",
        ]
        for k, (n, us) in sorted(t.kernels.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"| kernel | `{k[:120]}` | {n:g} | {us:.1f} |")
        for op, n in sorted(t.host_ops.items()):
            lines.append(f"| torch op (attnbench code) | `{op}` | {n:g} | |")
        for op, n in sorted(t.library_ops.items()):
            lines.append(f"| torch op (library code) | `{op}` | {n:g} | |")
        if not t.kernels and not t.host_ops and not t.library_ops:
            lines.append("| | (nothing recorded) | | |")
        lines.append("")
    lines.append(
        f"Traced with torch.profiler over {next((t.calls for t in traces.values() if not isinstance(t, str)), 0)} "
        "calls after one untraced call; times include the profiler's overhead (speed: `attnbench sweep`)."
    )
    return "\n".join(lines) + "\n"
