#!/usr/bin/env bash
# Add deployed serving libraries' kernels (SGLang) to the current Python environment WITHOUT
# replacing its torch or triton: pinned versions from tools/deployed/<name>.txt, each installed with
# --no-deps (these libraries pin their own torch). Checks afterwards that torch and triton are the
# versions they were and that attnbench's backend imports the kernels.
#
#   tools/install-deployed.sh sglang        # into the active environment (python -m pip)
#   tools/install-deployed.sh vllm          # vLLM's Triton unified attention (a 336 MB download)
#   PYTHON=/path/to/python tools/install-deployed.sh sglang
#
# Docs: docs/deployed.md. Exit 0 when installed and importable; 1 otherwise (with the reason).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-python}"
[ $# -ge 1 ] || { echo "usage: $0 sglang|vllm ..." >&2; exit 2; }
versions() { "$py" -c 'import importlib.metadata as m
for d in ("torch", "triton"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, "absent")'; }
before="$(versions)"
for name in "$@"; do
  list="$here/deployed/$name.txt"
  [ -f "$list" ] || { echo "$0: no pinned list for '$name' (have: $(cd "$here/deployed" && ls *.txt | sed 's/\.txt//' | tr '\n' ' '))" >&2; exit 2; }
  "$py" -m pip install -q --no-deps -r "$list"
done
after="$(versions)"
if [ "$before" != "$after" ]; then
  echo "$0: torch/triton changed (before: $before; after: $after)" >&2; exit 1
fi
for name in "$@"; do
  "$py" - "$name" <<'PY'
import sys
name = sys.argv[1]
import importlib
_lib = importlib.import_module(f"attnbench.kernels.{name}._lib")  # each library's import guard
why = _lib.missing()
print(f"{name} {_lib.PINNED}: " + ("kernels import" if why is None else f"installed, but {why}"))
sys.exit(0 if why is None else 1)
PY
done
