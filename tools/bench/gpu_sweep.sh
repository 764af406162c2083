#!/usr/bin/env bash
# One GPU call: `attnbench sweep NAME ARGS...` into /tmp/runs/NAME, then results.jsonl, summary.md,
# run.json and env.json copied to $OUT/NAME (the device tool brings back at most 8 files).
# Usage (repo root, .gpu parts unpacked): bash tools/bench/gpu_sweep.sh NAME SECONDS SWEEP-ARGS...
# Called again with the same NAME on the same machine, it resumes the run (--resume).
set -uo pipefail
export PYTHONUNBUFFERED=1
# The device machines set PYTHONDONTWRITEBYTECODE=1: every process would compile the libraries it imports
# from source (13.7 s a process on an H100 with every backend). A CI runner keeps its bytecode; so do we
# (a second run on the same machine imports from /tmp/pycache; env.json records no_bytecode_cache otherwise).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
name=$1; secs=$2; shift 2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/$name"
python -c "import attnbench" 2>/dev/null || python -m pip install --no-deps --no-build-isolation -q -e . >/tmp/pip.log 2>&1
again=(); [ -f "/tmp/runs/$name/run.json" ] && again=(--resume)  # a run cut by the time limit goes on
timeout "$secs" python -m attnbench sweep "$@" "${again[@]}" --out "/tmp/runs/$name" >>"/tmp/runs-$name.log" 2>&1
echo "== $name: sweep exit $?"; grep -v "^progress" "/tmp/runs-$name.log" | tail -25
for f in results.jsonl summary.md run.json env.json; do cp "/tmp/runs/$name/$f" "$OUT/$name/" 2>/dev/null; done
