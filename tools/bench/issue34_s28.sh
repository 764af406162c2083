#!/usr/bin/env bash
# What session 27 built after its GPU time was spent, in two GPU calls of under 10 minutes each (repo root,
# set-up done: tools/bench/gpu_setup.sh; later calls `export PYTHONPATH=/tmp/vllm-site`):
#   extend, extend2: gdn_out=wide and the T kernel's register cap, before and after the output kernel's tuning
#                    key took the size (ran; both are the defaults since 8b2ceba, see below)
#   bash tools/bench/issue34_s28.sh ncu      # our decode at B16 L1024 on today's plan, and FA4's
#   bash tools/bench/issue34_s28.sh defaults # every suite's gdn_extend rows on the new defaults, float64 only
#   bash tools/bench/issue34_s28.sh gdnx     # the gdn suite's rows timed, today's default against the former
#   bash tools/bench/issue34_s28.sh targets  # the whole targets suite, every backend (AOT modules installed)
# Then tar each $OUT/<name> (the device tool brings back at most 8 files).
set -uo pipefail
here=$(dirname "$0")
case ${1:-} in
extend|extend2)
  # Ran on h200-session28's first two trees (reports/examples/h200-session28/README.md): every gdn_extend row of
  # `gdn` with -b triton -b triton:gdn_out=wide -b triton-gdn-tri:maxnreg128 -b flashinfer (extend: before the
  # output kernel's tuner key took the size, 7ec068b; extend2: after; extend also ran `--sanitize memcheck` on
  # T1024 with gdn_out=wide first). Both variants became the defaults in 8b2ceba, so those backends are gone:
  # `defaults` times today's default against the former configs (gdn_out=narrow, triton-gdn-tri:uncapped).
  echo "$0 $1: ran on an earlier tree whose variants are the defaults now; run: $0 defaults" >&2; exit 2 ;;
defaults)
  # the T kernel's 128-register cap and the output kernel's split-column configs are the defaults now: every
  # gdn_extend row of every suite against float64 (no timing). In session 28 a 200 s limit stopped it twice at
  # the sixth case (float32 K = V = 128, whose output-kernel configs take minutes of ptxas): give it the call
  bash "$here/gpu_sweep.sh" xsuites 540 smoke ci gdn targets large --op gdn_extend -b triton --no-timing ;;
gdnx)
  # the gdn suite's rows timed: today's default against the former configs and FlashInfer (ran in session 28)
  bash "$here/gpu_sweep.sh" gdnx 200 gdn --op gdn_extend --plugin "$here/gdn_tri_variants.py" -b triton \
    -b triton:gdn_out=narrow -b triton-gdn-tri:uncapped -b flashinfer ;;
targets)
  bash "$here/gpu_sweep.sh" targets 560 targets ;;
ncu)
  # h200-session23 profiled the plan before session 24 (unsplit)
  NCU_ROW_S=150 bash "$here/ncu_rows.sh" "$here/issue34f.ncu"; tail -6 "$OUT/ncu/summary.md" ;;
*) echo "usage: $0 defaults|gdnx|targets|ncu" >&2; exit 2 ;;
esac
