#!/usr/bin/env bash
# One GPU call (about 6 minutes warm): the opt-in variants issue #34 has waiting, each beside the best
# peers of its rows, as `attnbench sweep` runs under $OUT (tools/bench/gpu_sweep.sh: NAME SECONDS ARGS).
# Usage (repo root, .gpu parts unpacked, PYTHONPATH with vLLM's tree): bash tools/bench/issue34_variants.sh
# Then tar each $OUT/<name> (the device tool brings back at most 8 files).
set -uo pipefail
here=$(dirname "$0")
# small-batch decode: two splits with the merge overlapped (PDL) beat unsplit at B16 L1024 on an H200
# (h200-session23/dec); fill_keys is the planner's rule for it, with and without PDL
bash "$here/gpu_sweep.sh" split 170 targets --op decode -k b16- -k b64-l1024 \
  --case decode/b32-l1024-h32x8-d128-p16-bf16 --case decode/b8-l1024-h32x8-d128-p16-bf16 -k b32-l1024 -k b8-l1024 \
  -b triton -b triton:fill_keys=512 -b "triton:fill_keys=512,decode_pdl=1" -b "triton:fill_keys=256,decode_pdl=1" \
  -b fa4 -b flashinfer
# GDN decode: the streamed kernel (kernels/triton/gdn_decode_stream.py) against FlashInfer's pipelined one
bash "$here/gpu_sweep.sh" gdnd 150 targets --op gdn_decode --case gdn_decode/b128-h16x32-d128x128-bf16 \
  -b triton -b triton:gdn_stream=128 -b "triton:gdn_stream=128,gdn_stream_bv=32" \
  -b "triton:gdn_stream=64,gdn_warps=2" -b "triton:gdn_stream=128,gdn_stream_bv=8,gdn_warps=1" \
  -b cute -b flashinfer -b sglang
# our CuTe decode: its schedule variants (tools/bench/cute_variants.py) at B64 L4096, 0.77 of FlashInfer
bash "$here/gpu_sweep.sh" cuted 150 targets --op decode -k b64-l4096-h32x8-d128-p16-bf16 -k b16-l4096 \
  --plugin "$here/cute_variants.py" -b cute -b cute-decode:vpl1-u4 -b cute-decode:vpl1-u4-s3-minctas4 \
  -b cute-decode:vpl2-u2-s2 -b cute-decode:4ctas-minsplit512 -b fa4 -b flashinfer
