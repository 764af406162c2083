"""The environment a run measured on: machine, device, and versions of every library a backend uses."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys

import torch

LIBRARIES = ("torch", "triton", "flashinfer-python", "nvidia-cutlass-dsl", "flash-attn-4", "fla-core", "numpy",
             "sglang", "sgl-kernel", "vllm")  # fmt: skip


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def capture(device: str) -> dict:
    """A JSON-able description of this machine and `device`."""
    from attnbench import __version__

    env = {
        "attnbench": __version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "device": device,
        "libraries": {d: v for d in LIBRARIES if (v := _version(d))},
    }
    if sys.flags.dont_write_bytecode:  # every process compiles what it imports: seconds of each worker's start
        env["no_bytecode_cache"] = True
    if os.environ.get("TRITON_INTERPRET") == "1":  # Triton kernels run in the CPU interpreter: not GPU timings
        env["triton_interpret"] = True
    dev = torch.device(device)
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        env.update(
            gpu=p.name,
            capability=f"{p.major}.{p.minor}",
            sm_count=p.multi_processor_count,
            memory_gb=round(p.total_memory / 2**30, 1),
            l2_mb=round(p.L2_cache_size / 2**20, 1),
            cuda=torch.version.cuda,
        )
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:
            pass
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env


def short(env: dict) -> dict:
    """The few fields every result row carries."""
    return {k: env[k] for k in ("device", "gpu", "cpu", "torch", "triton_interpret") if k in env} | {
        "torch": env.get("libraries", {}).get("torch")
    }
