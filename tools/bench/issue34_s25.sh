#!/usr/bin/env bash
# One GPU call (about 4 minutes warm): issue #34's rows after session 24 (h200-session25), as `attnbench sweep`
# runs under $OUT (tools/bench/gpu_sweep.sh: NAME SECONDS ARGS). Then tar each $OUT/<name>.
# Usage (repo root, .gpu parts unpacked, PYTHONPATH with vLLM's tree): bash tools/bench/issue34_s25.sh
set -uo pipefail
here=$(dirname "$0")
# GDN decode: the default kernel's small tiles on the canonical pool (knobs gdn_bv / gdn_warps, no tuning)
# against its tuned tile, the K-last kernel's best programs (h200-session25/gdnvk2: 16 or 8 rows on one warp,
# 273-274 us against FlashInfer's 266.7) and FlashInfer, on the targets row and the GVA row
bash "$here/gpu_sweep.sh" gdntile 200 targets --op gdn_decode --case gdn_decode/b128-h16x32-d128x128-bf16 \
  -b triton -b "triton:gdn_bv=16,gdn_warps=1" -b "triton:gdn_bv=16,gdn_warps=2" -b "triton:gdn_bv=32,gdn_warps=1" \
  -b "triton:gdn_bv=32,gdn_warps=2" -b "triton:gdn_bv=8,gdn_warps=1" -b "triton:gdn_bv=64,gdn_warps=2" \
  -b "triton:gdn_vk=16,gdn_warps=1" -b "triton:gdn_vk=8,gdn_warps=1" -b "triton:gdn_vk=32,gdn_warps=1" -b flashinfer
# decode B16 L1024 (0.95 of FA4): stage-1 pipelining depth and warps under the default split plan
bash "$here/gpu_sweep.sh" b16 150 targets --op decode -k b16-l1024 -k b16-l4096 \
  -b triton -b triton:decode_stages=4 -b triton:decode_stages=5 -b triton:decode_warps=2 -b triton:decode_warps=8 \
  -b "triton:split_keys=256,block_n=32" -b "triton:split_keys=256,block_n=32,decode_stages=4" -b fa4
