#!/usr/bin/env bash
# vLLM's pure-Python tree for a GPU machine that has no registry and takes at most 64 MiB per transfer:
# vllm 0.33.0's wheel (336 MB) without its compiled extensions, its vllm-rs binary, C/CUDA sources and headers, plus the
# regex wheel for the GPU's Python, as OUTDIR/vllm-site.tar.xz (JSON tuning configs left out too). The
# Triton unified attention attnbench drives needs none of what is left out; vllm.platforms.cuda imports
# vllm._C_stable_libtorch (92 MB, built for torch 2.14) to register ops it never calls, and attnbench's
# import guard stands in for it (kernels/vllm/_lib.py, docs/deployed.md). On the GPU machine:
#     mkdir -p /tmp/vllm-site && tar xf OUTDIR/vllm-site.tar.xz -C /tmp/vllm-site
#     PYTHONPATH=/tmp/vllm-site attnbench sweep decode -b vllm ...
#   tools/deployed/pack-vllm-py.sh [OUTDIR [PYTHON_VERSION]]     # default .gpu-vllm, 3.12
set -euo pipefail
out="${1:-.gpu-vllm}"
pyver="${2:-3.12}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python -m pip download -q --no-deps -d "$tmp" vllm==0.33.0
python -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$tmp" regex==2026.11.15
mkdir -p "$out" "$tmp/site"
# keep the pack out of git (carry it as an ignored path); .gitignore has /.gpu-vllm/. Not written into
# .git/info/exclude: in a worktree that file is the main checkout's, shared by every worktree.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && ! git check-ignore -q "$out/vllm-site.tar.xz"; then
  echo "$0: warning: $out is not git-ignored; add it to .gitignore before committing" >&2
fi
python - "$tmp" "$tmp/site" <<'PY'
import pathlib, sys, zipfile
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
skip = (".so", ".h", ".hpp", ".cuh", ".cu", ".cpp", ".c", ".inl", ".json", "vllm-rs")
for wheel in src.glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if wheel.name.startswith("vllm-") and name.endswith(skip):
                continue
            z.extract(name, dst)
PY
tar -C "$tmp/site" -cJf "$out/vllm-site.tar.xz" .
ls -l "$out/vllm-site.tar.xz"
