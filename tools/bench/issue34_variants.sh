#!/usr/bin/env bash
# One GPU call (about 5 minutes warm): the opt-in variants issue #34 has waiting, each beside the best
# peers of its rows, as `attnbench sweep` runs under $OUT (tools/bench/gpu_sweep.sh: NAME SECONDS ARGS).
# Usage (repo root, .gpu parts unpacked, PYTHONPATH with vLLM's tree): bash tools/bench/issue34_variants.sh
# Then tar each $OUT/<name> (the device tool brings back at most 8 files).
set -uo pipefail
here=$(dirname "$0")
# decode's PDL merge (on by default since session 24) against decode_pdl=0 on one machine, rows whose
# splits run in one wave (B8, B16 L1024: h200-session24/split) and in several (B64 L4096/L8192, B128 L8192)
bash "$here/gpu_sweep.sh" pdl 150 targets --op decode -k b16-l1024 -k b128-l8192-h32x8 -k b64-l4096-h32x8-d128-p16-bf16 \
  -k b64-l8192-h32x8 --case decode/b8-l1024-h32x8-d128-p16-bf16 -k b8-l1024 \
  -b triton -b triton:decode_pdl=0 -b triton:split_keys=256 -b "triton:split_keys=256,block_n=32" -b fa4 -b flashinfer
# our CuTe decode: its schedule variants (tools/bench/cute_variants.py) on the session-24 plan, 0.83 of
# FlashInfer at B64 L4096 (h200-session24/cute24)
bash "$here/gpu_sweep.sh" cuted 150 targets --op decode -k b64-l4096-h32x8-d128-p16-bf16 -k b16-l4096 -k b128-l1024 \
  --plugin "$here/cute_variants.py" -b cute -b cute-decode:vpl1-u4 -b cute-decode:vpl2-u2-s2 \
  -b cute-decode:8ctas-minsplit256 -b fa4 -b flashinfer
# GDN decode on a K-last pool (kernels/triton/gdn_decode_vk.py: FlashInfer's layout and program size;
# 40-91 registers on sm_90) against the default kernel, FlashInfer, SGLang and our CuTe one
bash "$here/gpu_sweep.sh" gdnvk 150 targets --op gdn_decode --case gdn_decode/b128-h16x32-d128x128-bf16 \
  -b triton -b triton:gdn_vk=8 -b triton:gdn_vk=16 -b triton:gdn_vk=32 -b "triton:gdn_vk=16,gdn_warps=2" \
  -b "triton:gdn_vk=8,gdn_warps=2" -b cute -b flashinfer -b sglang
