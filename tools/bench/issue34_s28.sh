#!/usr/bin/env bash
# What session 27 built after its GPU time was spent, in two GPU calls of under 10 minutes each (repo root,
# set-up done: tools/bench/gpu_setup.sh; later calls `export PYTHONPATH=/tmp/vllm-site`):
#   bash tools/bench/issue34_s28.sh extend   # gdn_extend: gdn_out=wide and the T kernel's register cap
#   bash tools/bench/issue34_s28.sh ncu      # our decode at B16 L1024 on today's plan, and FA4's
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
ncu)
  # h200-session23 profiled the plan before session 24 (unsplit)
  NCU_ROW_S=150 bash "$here/ncu_rows.sh" "$here/issue34f.ncu"; tail -6 "$OUT/ncu/summary.md" ;;
*) echo "usage: $0 extend|ncu" >&2; exit 2 ;;
esac
