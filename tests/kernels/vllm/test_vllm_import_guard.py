"""The vllm import guard on a simulated GPU machine (kernels/vllm/_lib.py): vllm's own CUDA platform
probe is made to see one GPU (its vendored NVML wrapper answers) and vLLM's compiled extensions are
hidden, as in the pure-Python pack (tools/deployed/pack-vllm-py.sh). The kernel module then fails to
import exactly as on the GPU machine (vllm.platforms.cuda -> vllm._C_stable_libtorch), and the guard
imports it with the stand-in, on vLLM's CUDA platform, with triton's CUDA driver reported active (so
vLLM keeps the real triton, not its placeholders). Runs in a fresh interpreter (vLLM caches its
platform); needs vllm installed (tools/install-deployed.sh vllm)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from attnbench.kernels.vllm import _lib

SIMULATED_GPU = textwrap.dedent(
    """
    import importlib, importlib.abc, importlib.machinery, json, sys

    class NoCompiledExtensions(importlib.abc.MetaPathFinder):  # the pack: vllm/ without its .so files
        def find_spec(self, name, path, target=None):
            if name.startswith("vllm."):
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                if spec is not None and (spec.origin or "").endswith(".so"):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoCompiledExtensions())
    from triton.backends import backends  # triton's CUDA driver active, as on the GPU (real triton.jit)

    backends["nvidia"].driver.is_active = staticmethod(lambda: True)
    import vllm.third_party.pynvml as nvml  # what vllm.platforms.cuda_platform_plugin asks

    nvml.nvmlInit = nvml.nvmlShutdown = lambda *a, **k: None
    nvml.nvmlDeviceGetCount = lambda: 1

    out = {}
    try:
        importlib.import_module("vllm.v1.attention.ops.triton_unified_attention")
    except ModuleNotFoundError as e:
        out["plain_import"] = e.name
        frames = __import__("traceback").extract_tb(e.__traceback__)
        out["chain"] = [f.filename.rpartition("/vllm/")[2] for f in frames if "/vllm/" in f.filename]
    from attnbench.kernels.vllm import _lib

    out["missing"] = _lib.missing()
    out["stood_in"] = _lib.stood_in()
    out["callable"] = callable(_lib.unified_attention())
    from vllm.platforms import current_platform

    out["jit"] = type(sys.modules[_lib.UNIFIED].kernel_unified_attention).__name__
    out["platform"] = type(current_platform).__module__
    out["fp8"] = str(current_platform.fp8_dtype())
    out["left_in_sys_modules"] = _lib.COMPILED_OPS in sys.modules
    try:
        importlib.import_module(_lib.COMPILED_OPS)
    except ModuleNotFoundError:
        out["later_import"] = "ModuleNotFoundError"
    print(json.dumps(out))
    """
)


def _vllm_installed() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(not _vllm_installed(), reason="vllm is not installed (tools/install-deployed.sh vllm)")
def test_kernel_imports_on_a_simulated_gpu_without_vllm_compiled_extensions():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the GPU compiles, no interpreter
    done = subprocess.run([sys.executable, "-c", SIMULATED_GPU], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # the failure seen on the GPU machine, and where it comes from
    assert out["plain_import"] == "vllm._C_stable_libtorch"
    chain = out["chain"]
    assert "v1/attention/ops/triton_unified_attention.py" in chain and chain[-1] == "platforms/cuda.py", chain
    assert chain.index("platforms/__init__.py") < chain.index("platforms/cuda.py")
    # the guard: imported, on vLLM's CUDA platform, stand-in gone afterwards
    assert out["missing"] is None and out["stood_in"] and out["callable"] and out["jit"] == "JITFunction"
    assert out["platform"] == "vllm.platforms.cuda" and out["fp8"] == "torch.float8_e4m3fn"
    assert not out["left_in_sys_modules"] and out["later_import"] == "ModuleNotFoundError"


def test_stand_in_answers_nothing_and_leaves_no_trace():
    import types

    parent = types.ModuleType("attnbench_fake_vllm")
    sys.modules["attnbench_fake_vllm"] = parent
    try:
        with _lib._standing_in("attnbench_fake_vllm._C"):
            standin = sys.modules["attnbench_fake_vllm._C"]
            parent._C = standin  # as an import that loaded it would
            for name in ("ops", "reshape_and_cache_flash", "__path__"):
                with pytest.raises(AttributeError, match="stand-in"):
                    getattr(standin, name)
        assert "attnbench_fake_vllm._C" not in sys.modules and not hasattr(parent, "_C")
    finally:
        del sys.modules["attnbench_fake_vllm"]


def test_guard_stands_in_only_for_the_compiled_ops_module(monkeypatch):
    calls = []

    def fails(name):
        calls.append(name in sys.modules and _lib.COMPILED_OPS in sys.modules)
        raise ModuleNotFoundError("No module named 'vllm._moe_C'", name="vllm._moe_C")

    # the guard's own importlib only: the process's import_module stays (triton imports its backends with it)
    monkeypatch.setattr(_lib, "importlib", types.SimpleNamespace(import_module=fails))
    with pytest.raises(ModuleNotFoundError):
        _lib._import_modules()
    assert calls == [False]  # another missing module: no retry, no stand-in


INTERPRETER = textwrap.dedent(
    """
    import json, sys
    if sys.argv[1] == "vllm-first":
        import vllm.triton_utils  # noqa: F401  (binds placeholders: no active driver on this CPU)
    from triton.backends import backends

    driver = backends["nvidia"].driver
    before = driver.__dict__.get("is_active")
    from attnbench.kernels.vllm import _lib

    out = {"missing": _lib.missing()}
    if out["missing"] is None:
        out["kernels"] = [type(getattr(sys.modules[m], k)).__name__ for m, k in
                          ((_lib.MLA_DECODE, "_fwd_grouped_kernel_stage1"), (_lib.UNIFIED, "kernel_unified_attention"))]
    from vllm.platforms import current_platform

    out["platform"] = type(current_platform).__name__
    out["driver_restored"] = driver.__dict__.get("is_active") is before and not driver.is_active()
    print(json.dumps(out))
    """
)


def _interpreted(order: str) -> dict:
    # CUDA_VISIBLE_DEVICES unset: vLLM reads an empty one as a distributed worker and keeps triton anyway
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"} | {"TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", INTERPRETER, order], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CPU_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the interpreter binding is for machines without a CUDA device"
)


@CPU_ONLY
@pytest.mark.skipif(not _vllm_installed(), reason="vllm is not installed (tools/install-deployed.sh vllm)")
def test_interpreter_binds_vllm_to_the_real_triton_and_restores_the_driver():
    out = _interpreted("guard-first")
    assert out["missing"] is None and out["kernels"] == ["InterpretedFunction", "InterpretedFunction"]
    assert out["platform"] != "CudaPlatform" and out["driver_restored"]


@CPU_ONLY
@pytest.mark.skipif(not _vllm_installed(), reason="vllm is not installed (tools/install-deployed.sh vllm)")
def test_interpreter_says_when_vllm_bound_placeholders_first():
    out = _interpreted("vllm-first")
    assert "bound triton placeholders" in out["missing"] and out["driver_restored"]
