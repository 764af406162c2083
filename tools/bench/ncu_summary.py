"""Summarise `ncu --csv --page details` files (tools/bench/ncu_rows.sh) as one markdown table.

Usage: python tools/bench/ncu_summary.py DIR   (reads DIR/*.csv and their DIR/*.row "CASE BACKEND")
One line per profiled kernel (its last launch: an autotuner's trials come first): its row, duration, DRAM and SM throughput (% of peak), achieved
occupancy, registers per thread, grid x block, cycles per issued instruction, and the three largest
stall reasons (warps stalled per issued instruction, from smsp__average_warps_issue_stalled_*).
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

WANT = {
    "Duration": "dur",
    "DRAM Throughput": "dram%",
    "Compute (SM) Throughput": "sm%",
    "Achieved Occupancy": "occ%",
    "Registers Per Thread": "regs",
    "Warp Cycles Per Issued Instruction": "cpi",
}
STALL = "smsp__average_warps_issue_stalled_"


def kernels(path: Path) -> list[dict]:
    """One dict per profiled kernel launch: name, grid, block, the WANT metrics and the stalls."""
    lines = path.read_text(errors="replace").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    body = [line for line in lines[start:] if line.startswith('"')]
    out: dict[str, dict] = defaultdict(lambda: {"stalls": {}})
    for r in csv.DictReader(body):
        k = out[r["ID"]]
        k.update(name=r.get("Kernel Name", "?"), grid=r.get("Grid Size", ""), block=r.get("Block Size", ""))
        name, unit, value = r.get("Metric Name", ""), r.get("Metric Unit", ""), r.get("Metric Value", "")
        if name in WANT:
            k[WANT[name]] = f"{value} {unit}".strip() if name == "Duration" else value
        elif name.startswith(STALL):
            reason = name[len(STALL) :].removesuffix("_per_issue_active.ratio")
            try:
                k["stalls"][reason] = float(value.replace(",", ""))
            except ValueError:
                pass
    last: dict[str, dict] = {}  # a kernel launched again (an autotuner's trials) counts by its last launch
    for k in out.values():
        last.pop(k.get("name", "?"), None)
        last[k.get("name", "?")] = k
    return list(last.values())


def main(folder: str) -> int:
    d = Path(folder)
    print(
        "| row | backend | kernel | duration | DRAM % | SM % | occupancy % | regs | grid x block | cycles/issue | top stalls |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|---:|---|")
    for csv_path in sorted(d.glob("*.csv")):
        row = csv_path.with_suffix(".row")
        case, _, backend = (row.read_text().strip() if row.exists() else csv_path.stem).partition(" ")
        found = kernels(csv_path)
        if not found:
            print(f"| {case} | {backend} | (no kernel profiled: see {csv_path.with_suffix('.err').name}) |||||||||")
        for k in found:
            top = sorted(k["stalls"].items(), key=lambda kv: -kv[1])[:3]
            stalls = ", ".join(f"{n} {v:.2f}" for n, v in top)
            name = k["name"][:60]
            print(f"| {case} | {backend} | `{name}` | {k.get('dur', '')} | {k.get('dram%', '')} | {k.get('sm%', '')} | "
                  f"{k.get('occ%', '')} | {k.get('regs', '')} | {k['grid']} x {k['block']} | {k.get('cpi', '')} | {stalls} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
