#!/usr/bin/env bash
# What session 26 changed after its GPU time was spent, in two GPU calls of under 10 minutes each:
#   bash tools/bench/issue34_s27.sh timed    # verifyvk and fixes (about 5 minutes warm)
#   bash tools/bench/issue34_s27.sh checks   # the GPU timing tests and the whole chain suite
#   bash tools/bench/issue34_s27.sh regs     # gdn_extend: the state pass on the transposed state
#   bash tools/bench/issue34_s27.sh targets  # targets, every backend
#   bash tools/bench/issue34_s27.sh suites   # every suite's gdn_verify and gdn_decode rows, triton and cute
# (repo root, .gpu parts unpacked, PYTHONPATH with vLLM's tree). Then tar each $OUT/<name> (the device tool
# brings back at most 8 files).
set -uo pipefail
here=$(dirname "$0")
case ${1:-} in
timed)
  # gdn_verify on the K-last pool with K-last intermediate states (1a4ee21) against the canonical layout: in
  # h200-session26/gdnlayout the K-last verify ran 1.01-1.65x the canonical one (a per-step layout conversion)
  bash "$here/gpu_sweep.sh" verifyvk 150 gdn --op gdn_verify --op gdn_decode -k b256 -k b32 -k b16 \
    -b triton -b triton:gdn_layout=kv -b sglang -b flashinfer
  # the two failures of h200-session26 that were fixed on the CPU: SGLang's extend after a failed capture
  # (2e87a5b, timing.CaptureFailed) and our CuTe decode's softplus log (b7bc9ce)
  bash "$here/gpu_sweep.sh" fixes 120 --case gdn_extend/b1-t1024-h16x32-d128x128-bf16 \
    --case gdn_decode/b256-h16x32-d128x128-bf16 -b sglang -b triton -b flashinfer -b cute ;;
checks)
  mkdir -p "$OUT/gputests"
  timeout 120 python -m pytest -q -p no:cacheprovider -m gpu tests/harness/test_timing_gpu.py \
    tests/harness/test_shared_timing_faults.py > "$OUT/gputests/pytest.txt" 2>&1; echo "== gpu tests: exit $?"
  tail -5 "$OUT/gputests/pytest.txt"
  # the chain suite, which session 26 cut after 5 of 27 rows
  bash "$here/gpu_sweep.sh" chain 300 chain -b chain --no-timing ;;
regs)
  # gdn_extend's serial state pass on the transposed state (gdn_state_regs=1: S^T and U'^T as the products'
  # register operands) against the default (S through shared memory), every gdn_extend row of `gdn`
  bash "$here/gpu_sweep.sh" regs 240 gdn --op gdn_extend -b triton -b triton:gdn_state_regs=1 -b flashinfer
  NCU_ROW_S=150 bash "$here/ncu_rows.sh" "$here/issue34e.ncu"; tail -8 "$OUT/ncu/summary.md" ;;
targets)
  # the targets suite at this tree, every backend (its GDN extend row is one of regs' rows)
  bash "$here/gpu_sweep.sh" targets 560 targets ;;
suites)
  # correctness on every suite of the two ops our kernels changed after h200-session26/suites ran (f044f20):
  # gdn_verify (triton, K-last intermediate states, 1a4ee21) and gdn_decode (cute, its softplus log, b7bc9ce)
  bash "$here/gpu_sweep.sh" suites 300 ci serving swa spec mla decode extend gdn --op gdn_verify --op gdn_decode \
    -b triton -b cute --no-timing ;;
*) echo "usage: $0 timed|checks|regs|targets|suites" >&2; exit 2 ;;
esac
