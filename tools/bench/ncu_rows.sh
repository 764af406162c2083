#!/usr/bin/env bash
# One GPU call: Nsight Compute on the checked call of (case, backend) rows, then one table of them all.
# Usage (repo root, .gpu parts unpacked): bash tools/bench/ncu_rows.sh ROWS-FILE [EXTRA SWEEP ARGS...]
# ROWS-FILE: one "CASE-ID BACKEND" per line (# comments; BACKEND may carry knobs: triton:gdn_stream=128). EXTRA SWEEP ARGS must not name a suite: `--case` adds its
# case to a suite's cases (h100-session22: `... targets` profiled every targets row of each backend). Each row runs `attnbench sweep --case ... -b ...
# --no-timing --no-isolate` under ncu, which keeps only the kernels inside the row's NVTX range
# `attnbench:<backend>` (harness/run/runner.py `nvtx_range`, `_profiled`: the first, checked call), after a warm-up run of
# the same row without ncu (Triton autotuning cached on disk: TRITON_CACHE_AUTOTUNING=1). Writes $OUT/ncu/<n>.csv
# and $OUT/ncu/summary.md (tools/bench/ncu_summary.py: per kernel, its last launch, its duration, DRAM and SM throughput,
# occupancy, registers, grid and the top stall reasons).
set -uo pipefail
rows=$1; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/ncu"
python -c "import attnbench" 2>/dev/null || python -m pip install --no-deps --no-build-isolation -q -e . >/tmp/pip.log 2>&1
export TRITON_CACHE_AUTOTUNING=1  # the warm-up run below tunes; the profiled call then launches only the winner
n=0
grep -v '^\s*#' "$rows" | while read -r case backend; do
  [ -n "$case" ] || continue
  # the NVTX range of the backend as the sweep names it (`triton:k=v` runs as `triton[k=v]`; runner.nvtx_range)
  range=$(python -c 'import sys; from attnbench.backend import get_backend, load_builtin; load_builtin()
from attnbench.run.runner import nvtx_range; print(nvtx_range(get_backend(sys.argv[1]).name))' "$backend" 2>/dev/null \
    || echo "attnbench:$backend")
  n=$((n + 1)); tag=$(printf "%02d-%s" "$n" "$(echo "$backend" | tr -c 'A-Za-z0-9_.\n-' '_')")
  echo "$case $backend" >"$OUT/ncu/$tag.row"
  timeout "${NCU_ROW_S:-240}" python -m attnbench sweep --case "$case" -b "$backend" --no-timing --no-isolate \
    --overwrite --out "/tmp/ncu-runs/$tag-warm" "$@" >/dev/null 2>&1  # autotuning and JIT, outside ncu
  timeout "${NCU_ROW_S:-240}" ncu --nvtx --nvtx-include "$range/" --target-processes all \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" --csv --page details \
    python -m attnbench sweep --case "$case" -b "$backend" --no-timing --no-isolate --overwrite \
    --out "/tmp/ncu-runs/$tag" "$@" >"$OUT/ncu/$tag.csv" 2>"$OUT/ncu/$tag.err"
  echo "== $tag exit $? ($case)"
done
python tools/bench/ncu_summary.py "$OUT/ncu" >"$OUT/ncu/summary.md"; cat "$OUT/ncu/summary.md"
