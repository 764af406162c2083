#!/usr/bin/env bash
# What session 27 built after its GPU time was spent, in two GPU calls of under 10 minutes each (repo root,
# set-up done: tools/bench/gpu_setup.sh; later calls `export PYTHONPATH=/tmp/vllm-site`):
#   bash tools/bench/issue34_s28.sh extend   # gdn_extend: gdn_out=wide and the T kernel's register cap
#   bash tools/bench/issue34_s28.sh extend2  # the same after the output kernel's tuning key took the size
#   bash tools/bench/issue34_s28.sh ncu      # our decode at B16 L1024 on today's plan, and FA4's
#   bash tools/bench/issue34_s28.sh defaults # after both won in extend2 and became the defaults (below)
#   bash tools/bench/issue34_s28.sh targets  # the whole targets suite, every backend (AOT modules installed)
# Then tar each $OUT/<name> (the device tool brings back at most 8 files).
set -uo pipefail
here=$(dirname "$0")
case ${1:-} in
extend)
  # gdn_out=wide: the output kernel's tuner also weighs 128 columns in two blocks of 64 (168 registers under
  # maxnreg, 3 programs an SM instead of 2). A Triton miscompile of this kernel (BV 32) read shared memory out of
  # range on an H200 (docs/findings.md), so every config of the tuner goes under compute-sanitizer first (T1024).
  bash "$here/gpu_sweep.sh" outsan 200 --case gdn_extend/b1-t1024-h16x32-d128x128-bf16 -b triton:gdn_out=wide \
    --no-timing --sanitize memcheck --sanitize-max 0
  # then every gdn_extend row: the default, gdn_out=wide, the T kernel under a 128-register cap
  # (triton-gdn-tri:maxnreg128: 4 programs an SM instead of 3), FlashInfer
  bash "$here/gpu_sweep.sh" extend 330 gdn --op gdn_extend --plugin "$here/gdn_tri_variants.py" -b triton \
    -b triton:gdn_out=wide -b triton-gdn-tri:maxnreg128 -b flashinfer ;;
extend2)
  # the same rows with the output kernel tuned per size of its launch (7ec068b): in `extend` a config tuned on
  # T = 1024 served T = 32768 (the default 3052.9 us there against 2346.6 in session 27)
  bash "$here/gpu_sweep.sh" extend2 330 gdn --op gdn_extend --plugin "$here/gdn_tri_variants.py" -b triton \
    -b triton:gdn_out=wide -b triton-gdn-tri:maxnreg128 -b flashinfer ;;
defaults)
  # the T kernel's 128-register cap and the output kernel's split-column configs are the defaults now: every
  # gdn_extend row of every suite against float64 (no timing), then the gdn suite's rows timed against FlashInfer
  bash "$here/gpu_sweep.sh" xsuites 200 smoke ci gdn targets large --op gdn_extend -b triton --no-timing
  bash "$here/gpu_sweep.sh" gdnx 200 gdn --op gdn_extend --plugin "$here/gdn_tri_variants.py" -b triton \
    -b triton:gdn_out=narrow -b triton-gdn-tri:uncapped -b flashinfer ;;
targets)
  bash "$here/gpu_sweep.sh" targets 560 targets ;;
ncu)
  # h200-session23 profiled the plan before session 24 (unsplit)
  NCU_ROW_S=150 bash "$here/ncu_rows.sh" "$here/issue34f.ncu"; tail -6 "$OUT/ncu/summary.md" ;;
*) echo "usage: $0 extend|extend2|defaults|targets|ncu" >&2; exit 2 ;;
esac
