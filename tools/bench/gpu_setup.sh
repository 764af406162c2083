#!/usr/bin/env bash
# The third set-up call on a fresh GPU machine, after `bash .gpu/a/unpack.sh` and `bash .gpu/b/unpack.sh`
# (carry [".gpu/c", ".fi-aot/mods", ".gpu-vllm"]): the last package part, FlashInfer's AOT modules built on
# the CPU machine, attnbench itself and vLLM's Python tree. Source it (`. tools/bench/gpu_setup.sh`) so the
# experiment that follows in the same command sees PYTHONPATH; later commands `export PYTHONPATH=/tmp/vllm-site`.
bash .gpu/c/unpack.sh >/tmp/unpack.log 2>&1 || { tail -5 /tmp/unpack.log; return 1 2>/dev/null || exit 1; }
aot=$(python -c 'import flashinfer, os; print(os.path.dirname(flashinfer.__file__))')/data/aot
mkdir -p "$aot" && cp -r .fi-aot/mods/* "$aot/"
python -m pip install --no-deps --no-build-isolation -q -e . >/tmp/pip.log 2>&1 || tail -5 /tmp/pip.log
mkdir -p /tmp/vllm-site && tar xf .gpu-vllm/vllm-site.tar.xz -C /tmp/vllm-site
export PYTHONPATH=/tmp/vllm-site
echo "== set-up done: $(python -c 'import attnbench, flashinfer, vllm; print("attnbench, flashinfer", flashinfer.__version__, "vllm", vllm.__version__)' 2>&1 | tail -1)"
