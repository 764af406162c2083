#!/usr/bin/env bash
# One GPU call (about 7 minutes warm): our GDN family on its new default pool layout, and head groups.
# Usage (repo root, .gpu parts unpacked, PYTHONPATH with vLLM's tree): bash tools/bench/issue34_s26.sh
# Then tar each $OUT/<name> (the device tool brings back at most 8 files).
set -uo pipefail
here=$(dirname "$0")
# our GDN state kernels on the K-last pool (the default since session 26: decode on the K-last kernel, 8 rows on
# one warp; verify, commit and extend addressing the K-last pool) against the canonical layout (gdn_layout=kv)
# and the K-last peers (kernels/triton/NOTES.md, K-last section)
bash "$here/gpu_sweep.sh" gdnlayout 330 gdn --op gdn_decode --op gdn_verify --op gdn_extend \
  -b triton -b triton:gdn_layout=kv -b flashinfer -b sglang
# gdn_extend head groups, each group's state pass and output on a stream of its own (h200-session25/gdng
# measured the one-shared-stream version at 1.2-5.5x the default)
bash "$here/gpu_sweep.sh" gdngroups 100 gdn --op gdn_extend -k t32768 -b triton -b triton:gdn_groups=2 \
  -b triton:gdn_groups=4 -b flashinfer
