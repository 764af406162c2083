#!/usr/bin/env bash
# Run every reproducer of docs/findings/repro on this (GPU) machine: each one's stdout+stderr and exit
# code go to "$OUT/findings/<name>.txt", one line per reproducer (name, exit code, last line) to
# "$OUT/findings/summary.txt". A crash or a timeout (REPRO_TIMEOUT seconds, default 120) is recorded and
# the next reproducer runs. Extra arguments go to every reproducer (e.g. --device cuda:1).
# Reproducers exit 0 (fixed), 1 (finding present) or 3 (crashed: import error, no GPU, ...).
# Exit code: 0 when every reproducer ran to a verdict (0 or 1), 1 when one crashed or timed out.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$PWD/out}/findings"
mkdir -p "$out"
: >"$out/summary.txt"
py="${PYTHON:-python3}"
status=0
for f in "$here"/*.py; do
  name="$(basename "$f" .py)"
  log="$out/$name.txt"
  timeout "${REPRO_TIMEOUT:-120}" "$py" "$f" "$@" >"$log" 2>&1
  rc=$?
  echo "exit code: $rc" >>"$log"
  last="$(grep -v '^exit code: ' "$log" | grep -v '^[[:space:]]*$' | tail -n 1)"
  case $rc in
    0 | 1) ;;
    124) last="TIMEOUT after ${REPRO_TIMEOUT:-120} s; $last"; status=1 ;;
    *) status=1 ;;
  esac
  printf '%s\t%s\t%s\n' "$name" "$rc" "$last" | tee -a "$out/summary.txt"
done
exit $status
