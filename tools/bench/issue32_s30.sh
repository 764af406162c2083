#!/usr/bin/env bash
# Session 30, issue #32 (time to verdict), in GPU calls of under 10 minutes each (repo root, set-up done:
# tools/bench/gpu_setup.sh; later calls `export PYTHONPATH=/tmp/vllm-site`):
#   bash tools/bench/issue32_s30.sh cold     # `targets`, every backend, on a fresh machine (fills the caches)
#   bash tools/bench/issue32_s30.sh warm     # the same again, warm (the number #32 asks about)
#   bash tools/bench/issue32_s30.sh profile  # warm again in one process under cProfile: where the harness's seconds go
#   bash tools/bench/issue32_s30.sh fla32    # FLA on smoke's float32 gdn_extend rows (never run on a GPU)
#   bash tools/bench/issue32_s30.sh l2norm   # the GDN recurrence kernels on gdn_common.l2_normalized: every float32
#                                            # gdn_decode/gdn_verify row (smoke's 8), every kernel that normalises
# Each writes $OUT/<name>/ (tar them: the device tool brings back at most 8 files).
set -uo pipefail
here=$(dirname "$0")
OUT=${OUT:-/tmp/out}
case ${1:-} in
cold) bash "$here/gpu_sweep.sh" targets 420 targets ;;
warm) bash "$here/gpu_sweep.sh" ${2:-targets2} 200 targets ;;
profile)
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
  mkdir -p "$OUT/profile"
  timeout 300 python -m cProfile -o "$OUT/profile/prof.out" -m attnbench sweep targets --no-isolate \
    --out /tmp/runs/profile >/tmp/runs-profile.log 2>&1
  echo "== profile: exit $?"; grep -v "^progress" /tmp/runs-profile.log | tail -5
  cp /tmp/runs/profile/summary.md /tmp/runs/profile/run.json "$OUT/profile/" 2>/dev/null
  python - "$OUT/profile/prof.out" >"$OUT/profile/prof.txt" <<'PY'
import pstats, sys
s = pstats.Stats(sys.argv[1])
s.sort_stats("cumulative").print_stats(120)
s.sort_stats("tottime").print_stats(60)
PY
  ;;
fla32) bash "$here/gpu_sweep.sh" fla32 240 smoke --op gdn_extend -b fla -b torch --no-timing ;;
l2norm)
  # the recurrence kernels' float32 path is IEEE-rounded now (their bf16/fp16 SASS is unchanged: compared on the CPU);
  # default (K-last pool: the K-last decode; verify on the preload variant), the per-step verify, the canonical pool
  # (the canonical decode kernel), the streamed decode
  cases=(); for c in gdn_decode/b6-h2x2-d32x16-pad2-fp32 gdn_decode/b3-h1x4-d16x16-pad1-packed-fp32 \
    gdn_decode/b3-h1x4-d128x128-pad2-scale0.4-fp32 gdn_decode/b3-h2x6-d16x48-fp32 gdn_verify/b5-t8-h2x2-d16x48-tree-fp32 \
    gdn_verify/b2-t8-h1x4-d16x16-pad1-scale0.4-fp32 gdn_verify/b2-t3-h2x6-d32x16-scale0.4-fp32 \
    gdn_verify/b2-t1-h2x6-d128x128-tree-fp32; do cases+=(--case "$c"); done
  ATTNBENCH_TRITON_AUTOTUNE=0 bash "$here/gpu_sweep.sh" l2norm 200 "${cases[@]}" -b torch -b triton \
    -b triton:gdn_preload=0 -b triton:gdn_layout=kv -b triton:gdn_layout=kv,gdn_stream=128 --no-timing ;;
*) echo "usage: $0 cold|warm [NAME]|profile|fla32|l2norm" >&2; exit 2 ;;
esac
