"""Import guard for SGLang's kernel modules (sglang 0.5.10.post1, installed without its dependencies).

`missing()` names what keeps the kernels from importing (None when they import); the modules are
imported once, lazily, so `attnbench list` stays fast where sglang is absent.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util

PINNED = "0.5.10.post1"
INSTALL = "install it without replacing torch: tools/install-deployed.sh sglang (docs/deployed.md)"

ATTENTION = "sglang.srt.layers.attention.triton_ops"
FLA = "sglang.srt.layers.attention.fla"
MAMBA = "sglang.srt.layers.attention.mamba"
MODULES = (
    f"{ATTENTION}.decode_attention",
    f"{ATTENTION}.extend_attention",
    f"{ATTENTION}.prefill_attention",
    f"{ATTENTION}.merge_state",
    f"{FLA}.fused_gdn_gating",
    f"{FLA}.fused_sigmoid_gating_recurrent",
    f"{FLA}.fused_recurrent",
    f"{FLA}.chunk",
    f"{MAMBA}.causal_conv1d_triton",
)


@functools.cache
def missing() -> str | None:
    """Why SGLang's Triton kernels cannot be imported here (None: they can)."""
    try:
        found = importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"sglang is not installed; {INSTALL}"
    try:
        for name in MODULES:
            importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == "torchvision":  # sglang.srt.utils imports torchvision.io; it must match torch
            return (
                "sglang's kernels need torchvision (sglang.srt.utils imports it): install the build matching your torch"
            )
        return f"sglang's kernels do not import (No module named {e.name!r}); {INSTALL}"
    except Exception as e:  # a broken install is a reason, not a crash
        return f"sglang's kernels do not import ({type(e).__name__}: {e}); {INSTALL}"
    return None


CUTE_GDN = "sglang.jit_kernel.cutedsl_gdn"


@functools.cache
def missing_cute() -> str | None:
    """Why SGLang's CuTe DSL GDN decode cannot be imported here (None: it can)."""
    why = missing()
    if why:
        return why
    try:
        importlib.import_module(CUTE_GDN)
    except Exception as e:  # CuTe DSL (nvidia-cutlass-dsl) and cuda-python are not sglang's --no-deps set
        return f"{CUTE_GDN} does not import ({type(e).__name__}: {e}); it needs nvidia-cutlass-dsl (pip install 'attnbench[gpu]')"
    return None


def module(name: str):
    """One of MODULES, by its last part (e.g. "decode_attention")."""
    return importlib.import_module(next(m for m in MODULES if m.rsplit(".", 1)[1] == name))
