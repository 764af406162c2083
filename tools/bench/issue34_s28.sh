#!/usr/bin/env bash
# What session 27 built after its GPU time was spent, in one GPU call of under 10 minutes (repo root, set-up
# done: tools/bench/gpu_setup.sh; later calls `export PYTHONPATH=/tmp/vllm-site`). Then tar $OUT/<name>s.
set -uo pipefail
here=$(dirname "$0")
# gdn_out=wide: the output kernel's tuner also weighs 128 columns in two blocks of 64 (168 registers under
# maxnreg, 3 programs an SM instead of 2). A Triton miscompile of this kernel (BV 32) read shared memory out of
# range on an H200 (docs/findings.md), so every config of the tuner goes under compute-sanitizer first (T1024).
bash "$here/gpu_sweep.sh" outsan 200 --case gdn_extend/b1-t1024-h16x32-d128x128-bf16 -b triton:gdn_out=wide \
  --no-timing --sanitize memcheck --sanitize-max 0
bash "$here/gpu_sweep.sh" outwide 200 gdn --op gdn_extend -b triton -b triton:gdn_out=wide -b flashinfer
# our decode at B16 L1024 on today's split plan, and FA4's, under Nsight Compute (h200-session23 profiled the
# plan before session 24)
NCU_ROW_S=120 bash "$here/ncu_rows.sh" "$here/issue34f.ncu"; tail -6 "$OUT/ncu/summary.md"
