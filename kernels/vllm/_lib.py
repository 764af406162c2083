"""Import guard for vLLM's Triton attention (vllm 0.33.0, installed with --no-deps; its compiled
extensions are not needed by these kernels).

Without vLLM's compiled extensions (the pure-Python pack of tools/deployed/pack-vllm-py.sh) the kernel
module does not import on a GPU machine: it reads `vllm.platforms.current_platform` at import, vLLM's
NVML probe then picks `vllm.platforms.cuda`, and that module's first line of work is
`import vllm._C_stable_libtorch  # import custom ops, trigger op registration` (a 92 MB library built
for torch 2.14). On a CPU the platform is "unspecified" and nothing reaches it. So when, and only
when, that import fails because the module is absent, the import is retried with `_NoCompiledOps`
standing in for it while the kernel module imports, and taken out of `sys.modules` afterwards. The
stand-in registers no ops and answers no attribute, so none of vLLM's compiled ops (`torch.ops._C.*`)
exists: vLLM code that called one would raise, not compute something else. The unified attention
launcher calls only Triton kernels and `current_platform` queries (fp8 dtype, device capability),
answered by vLLM's own CUDA platform, so what it computes and what is timed are what they would be
with the extensions installed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import types

PINNED = "0.33.0"
UNIFIED = "vllm.v1.attention.ops.triton_unified_attention"
COMPILED_OPS = "vllm._C_stable_libtorch"  # what vllm.platforms.cuda imports (for op registration)
INSTALL = "install it without replacing torch: tools/install-deployed.sh vllm (a 336 MB wheel; docs/deployed.md)"
STANDIN_WHY = (
    f"{COMPILED_OPS} is not installed (vLLM's pure-Python pack); this stand-in only lets "
    "vllm.platforms.cuda import for the Triton unified attention, which uses no compiled op"
)

_stood_in = False


class _NoCompiledOps(types.ModuleType):
    """Stands in for vLLM's compiled `_C_stable_libtorch` while the kernel module imports: registers
    no ops, and any attribute beyond what a module has raises."""

    def __getattr__(self, name):
        raise AttributeError(f"{self.__name__}.{name}: {STANDIN_WHY}")


@contextlib.contextmanager
def _standing_in(name: str = COMPILED_OPS):
    standin = _NoCompiledOps(name)
    sys.modules[name] = standin
    try:
        yield
    finally:
        if sys.modules.get(name) is standin:
            del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if getattr(sys.modules.get(parent), child, None) is standin:
            delattr(sys.modules[parent], child)


def _import_unified():
    """Import the kernel module; when vllm.platforms.cuda fails only for want of the compiled ops
    module, once more with the stand-in (None: imported)."""
    global _stood_in
    try:
        importlib.import_module(UNIFIED)
        return
    except ModuleNotFoundError as e:
        if e.name != COMPILED_OPS:
            raise
    with _standing_in():
        importlib.import_module(UNIFIED)
    _stood_in = True


def stood_in() -> bool:
    """Whether the kernel module imported with `_NoCompiledOps` standing in for vLLM's compiled ops."""
    missing()
    return _stood_in


@functools.cache
def missing() -> str | None:
    """Why vLLM's Triton unified attention cannot be imported here (None: it can)."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"vllm is not installed; {INSTALL}"
    try:
        _import_unified()
    except ModuleNotFoundError as e:
        return f"vllm's Triton attention does not import (No module named {e.name!r}); {INSTALL}"
    except Exception as e:
        return f"vllm's Triton attention does not import ({type(e).__name__}: {e}); {INSTALL}"
    return None


def unified_attention():
    why = missing()
    if why:
        raise ImportError(why)
    return sys.modules[UNIFIED].unified_attention
