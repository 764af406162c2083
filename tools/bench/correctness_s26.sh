#!/usr/bin/env bash
# One GPU call (about 9 minutes): every suite's correctness for our backends (triton, cute) since the decode
# defaults moved (session 24: PDL merge, shorter splits) and the GDN pool default moved to K-last (session 26);
# the chain suite through the chain backend. Usage as tools/bench/issue34_s26.sh; tar $OUT/<name> after.
set -uo pipefail
here=$(dirname "$0")
bash "$here/gpu_sweep.sh" chain 90 chain -b chain --no-timing
bash "$here/gpu_sweep.sh" suites 450 ci serving swa spec mla decode extend gdn -b triton -b cute --no-timing
