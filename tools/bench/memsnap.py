"""Where did the GPU memory go? Run `attnbench sweep ARGS...` in this process (`--no-isolate` is
added) with CUDA allocator history on, and at the first out-of-memory (or at the end) print the live
allocations grouped by the attnbench/kernels frame nearest to the allocation, largest first.

Usage (GPU machine, repo root):  python tools/bench/memsnap.py [--out-pickle F] -- SWEEP-ARGS...
e.g. `python tools/bench/memsnap.py -- large --op extend -b torch --no-timing --out /tmp/runs/mem`.
The pickle (`--out-pickle`) opens in https://pytorch.org/memory_viz.
"""

from __future__ import annotations

import argparse
import collections
import sys

import torch


def _frame_key(frames: list[dict]) -> str:
    """The innermost frame in attnbench's own code (harness, kernels, references), else the innermost."""
    for f in frames:
        name = f.get("filename", "")
        if any(part in name for part in ("/harness/", "/kernels/", "/references/", "/attnbench/")):
            return f"{name.split('/')[-2]}/{name.split('/')[-1]}:{f.get('line')} {f.get('name')}"
    return f"{frames[0].get('filename', '?')}:{frames[0].get('line')}" if frames else "?"


def summarize(snapshot: dict, top: int = 25) -> str:
    """Live (allocated) blocks of `snapshot` summed by `_frame_key` of their allocation stack."""
    by = collections.Counter()
    count = collections.Counter()
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            if b["state"] != "active_allocated":
                continue
            key = _frame_key(b.get("frames", []))
            by[key] += b["size"]
            count[key] += 1
    total = sum(by.values())
    lines = [f"live: {total / 2**30:.2f} GiB in {sum(count.values())} blocks"]
    for key, size in by.most_common(top):
        lines.append(f"  {size / 2**30:8.3f} GiB  {count[key]:6d} blocks  {key}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-pickle", default=None)
    ap.add_argument("sweep", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = [x for x in a.sweep if x != "--"]
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    fired = []

    def on_oom(device, alloc, device_alloc, device_free):
        if fired:
            return
        fired.append(True)
        snap = torch.cuda.memory._snapshot()
        print(f"== out of memory: asked {alloc / 2**30:.2f} GiB, {device_free / 2**30:.2f} GiB free", flush=True)
        print(summarize(snap), flush=True)
        if a.out_pickle:
            torch.cuda.memory._dump_snapshot(a.out_pickle)

    torch._C._cuda_attach_out_of_memory_observer(on_oom)
    from attnbench.cli.app import main as cli_main

    sys.argv = ["attnbench", "sweep", *args, "--no-isolate"]
    try:
        cli_main()
    except SystemExit as e:
        print(f"== sweep exit {e.code}", flush=True)
    if not fired:
        print("== no out-of-memory; live at the end:")
        print(summarize(torch.cuda.memory._snapshot()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
