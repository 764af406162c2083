#!/usr/bin/env bash
# One GPU call: the MLA decode variants (tools/bench/mla_variants.py) beside triton, triton-det and
# FlashInfer on the targets suite's DeepSeek-V3 rows, then Nsight Compute summaries of ours and of
# FlashInfer's fa3 MLA kernel on B128 L8192. Run from the repo root on the GPU machine after the
# .gpu parts are unpacked; writes everything under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
pip install --no-deps --no-build-isolation -q -e . >"$OUT/pip.log" 2>&1 || tail -3 "$OUT/pip.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv
SWEEP_S=${SWEEP_S:-400}
timeout "$SWEEP_S" python -m attnbench sweep targets -k h128x1 --plugin tools/bench/mla_variants.py \
  -b triton -b triton-det -b 'triton-mla-*' -b flashinfer-fa3 -b flashinfer --out "$OUT/mla" >"$OUT/sweep.log" 2>&1
echo "sweep exit $?"; tail -40 "$OUT/sweep.log"
[ "${NCU:-1}" = 1 ] || exit 0
C=$(python - <<'PY'
import json
ids = sorted({json.loads(l)["case_id"] for l in open("/tmp/out/mla/results.jsonl".replace("/tmp/out", __import__("os").environ.get("OUT", "/tmp/out"))) if "b128" in l})
print(ids[0] if ids else "")
PY
)
echo "ncu case: $C"
for pair in "triton-mla-n64-tma:_mla_decode_kernel" "triton-mla-generic:_decode_split_kernel" "flashinfer-fa3:MLA"; do
  b=${pair%%:*}; k=${pair#*:}
  timeout 120 ncu --target-processes all -k "regex:$k" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    python -m attnbench sweep --case "$C" -b "$b" --no-timing --no-isolate --out "$OUT/ncu-$b" --plugin tools/bench/mla_variants.py \
    >"$OUT/ncu-$b.txt" 2>&1
  echo "== ncu $b"; grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Shared Memory Config|Block Size|Grid Size|Stall|Warp Cycles Per Issued" "$OUT/ncu-$b.txt" | head -24
done
