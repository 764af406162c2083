#!/usr/bin/env bash
# The diagnostics of the SGLang Triton decode findings (docs/findings.md, issue 37) on one GPU machine,
# each one's stdout+stderr and exit code under "$OUT/findings/diag/", one line per step to
# "$OUT/findings/diag/summary.txt":
#   dump       data/dump_decode_inputs.py --big: the inputs too big to commit (b32-l4096 slice, b3-l80); needs attnbench
#   mha        sglang_decode_mha_bf16_scores.py on the exact inputs of the four MHA rows over their bound
#              (b3-l37, b3-l80, the b32-l4096 slice) and random data: exit 1 = scores summed in bf16
#   one_key    sglang_decode_one_key.py: the one-key d13 row, bisected, against the lane model; exit 1 = o != v somewhere
#   model      the bf16 score model alone (CPU): the failing elements it predicts
#   triton_lanes  triton_reduce_lanes_fma.py: Triton alone, one-key softmax with fp fusion on and off; exit 1 = lanes disagree
#   sweep      the harness rows themselves (attnbench sweep -b sglang --no-expect), for comparison
# Reproducers exit 0 (fixed / not reproduced), 1 (finding present) or 3 (crashed). REPRO_TIMEOUT (s, default 240).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$PWD/out}/findings/diag"
mkdir -p "$out/data"
: >"$out/summary.txt"
py="${PYTHON:-python3}"
t="${REPRO_TIMEOUT:-240}"
step() {  # step NAME COMMAND...
  local name="$1"; shift
  timeout "$t" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "exit code: $rc" >>"$out/$name.txt"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(grep -v '^exit code: ' "$out/$name.txt" | grep -v '^[[:space:]]*$' | tail -n 1)" \
    | tee -a "$out/summary.txt"
}
step dump "$py" "$here/data/dump_decode_inputs.py" --big "$out/data" --only-big
mha_inputs=(--inputs "$here/data/sglang_decode_mha_b3_l37.pt")
for f in sglang_decode_mha_b3_l80.pt sglang_decode_mha_b32_l4096_r3h3.pt; do
  [ -f "$out/data/$f" ] && mha_inputs+=(--inputs "$out/data/$f")
done
step model "$py" "$here/sglang_decode_mha_bf16_scores.py" --model-only "${mha_inputs[@]}" --random
step mha "$py" "$here/sglang_decode_mha_bf16_scores.py" "${mha_inputs[@]}" --random
step one_key "$py" "$here/sglang_decode_one_key.py"
step triton_lanes "$py" "$here/triton_reduce_lanes_fma.py"
step sweep "$py" -m attnbench sweep --device cuda --no-timing --no-expect -b sglang --out "$out/sweep" \
  --case decode/b2-l1-h4x4-d13-p1-swa6-poolswa-large_logits-bf16 --case decode/b3-l37-mixed-h4x4-d128-p1-bf16 \
  --case decode/b3-l80-mixed-h4x4-d128-p1-bf16 --case decode/b32-l4096-h32x32-d128-p16-bf16
exit 0
