#!/usr/bin/env bash
# One GPU call (about 8 minutes warm): what session 25 built and could not time (device time spent).
# Usage (repo root, .gpu parts unpacked, PYTHONPATH with vLLM's tree): bash tools/bench/issue34_s26.sh
# Then tar each $OUT/<name> (the device tool brings back at most 8 files).
set -uo pipefail
here=$(dirname "$0")
# our GDN family on a K-last pool (`gdn_layout=vk`: decode on the K-last kernel, 8 rows on one warp; verify,
# commit and extend addressing the K-last pool) against the canonical default and the K-last peers: if
# verify and extend hold their speed, the default moves to vk (kernels/triton/NOTES.md, K-last section)
bash "$here/gpu_sweep.sh" gdnlayout 300 gdn -b triton -b triton:gdn_layout=vk -b flashinfer -b sglang -b vllm
# gdn_extend head groups, each group's state pass and output on a stream of its own (h200-session25/gdng
# measured the one-shared-stream version at 1.2-5.5x the default)
bash "$here/gpu_sweep.sh" gdngroups 200 gdn --op gdn_extend -b triton -b triton:gdn_groups=2 \
  -b triton:gdn_groups=4 -b triton:gdn_groups=8 -b flashinfer
