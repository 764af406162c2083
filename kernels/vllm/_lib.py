"""Import guard for vLLM's Triton attention (vllm 0.33.0, installed with --no-deps; its compiled
extensions are not needed by these kernels): the unified attention and the split-KV decode its Triton
MLA backend runs (`triton_decode_attention`).

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

Under Triton's CPU interpreter (TRITON_INTERPRET=1, no CUDA device) `vllm.triton_utils` finds no active
Triton driver and binds placeholders for `triton`/`tl` (so `@triton.jit` kernels are plain functions that
cannot launch). There, and only there, the modules import while triton's CUDA driver reports itself
active (`_triton_driver_active`, restored afterwards), so vLLM binds the real triton, whose `jit` under
TRITON_INTERPRET=1 is the interpreter: the kernels' own code runs, program by program, in numpy. Where
vLLM's triton_utils was already imported with placeholders, `missing()` says so.
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
MLA_DECODE = "vllm.v1.attention.ops.triton_decode_attention"  # what TritonMLAImpl.forward_mqa calls
MODULES = (UNIFIED, MLA_DECODE)
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
def _in_sys_modules(name: str, module: types.ModuleType):
    """`module` imported as `name` for the block; afterwards gone from sys.modules and from its parent
    package's attributes (where an import bound it there), unless something replaced it meanwhile."""
    sys.modules[name] = module
    try:
        yield
    finally:
        if sys.modules.get(name) is module:
            del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if getattr(sys.modules.get(parent), child, None) is module:
            delattr(sys.modules[parent], child)


@contextlib.contextmanager
def _standing_in(name: str = COMPILED_OPS):
    with _in_sys_modules(name, _NoCompiledOps(name)):
        yield


def interpreted() -> bool:
    """Whether the kernels would run in Triton's CPU interpreter: TRITON_INTERPRET=1 and no CUDA device."""
    import torch

    from attnbench.kernels.triton.limits import interpreting

    return interpreting() and not torch.cuda.is_available()


@contextlib.contextmanager
def _triton_driver_active():
    """While inside: triton's CUDA driver reports itself active (vLLM's triton_utils then binds the real
    triton). Afterwards the driver class is as it was."""
    from triton.backends import backends

    driver = backends["nvidia"].driver
    own = "is_active" in vars(driver)
    before = vars(driver).get("is_active")
    driver.is_active = staticmethod(lambda: True)
    try:
        yield
    finally:
        if own:
            driver.is_active = before
        else:
            del driver.is_active


def _import_modules():
    """Import the kernel modules (under the interpreter with triton's driver reported active); when
    vllm.platforms.cuda fails only for want of the compiled ops module, once more with the stand-in."""
    global _stood_in
    bind = _triton_driver_active() if interpreted() else contextlib.nullcontext()
    with bind:
        try:
            for name in MODULES:
                importlib.import_module(name)
            return
        except ModuleNotFoundError as e:
            if e.name != COMPILED_OPS:
                raise
        with _standing_in():
            for name in MODULES:
                importlib.import_module(name)
        _stood_in = True


def _placeholders() -> str | None:
    """Under the interpreter: why vLLM's kernels are not Triton kernels (vLLM's triton_utils was imported
    before the guard and bound its placeholders), or None. Elsewhere None (a CPU without the interpreter
    runs no Triton kernel anyway: the backend says so)."""
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON or not interpreted():
        return None
    return (
        "vllm.triton_utils was imported before attnbench's import guard and bound triton placeholders "
        "(no active Triton driver): under TRITON_INTERPRET=1 let attnbench import vllm's kernels first"
    )


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
        _import_modules()
    except ModuleNotFoundError as e:
        return f"vllm's Triton attention does not import (No module named {e.name!r}); {INSTALL}"
    except Exception as e:
        return f"vllm's Triton attention does not import ({type(e).__name__}: {e}); {INSTALL}"
    return _placeholders()


def _loaded(module: str, name: str):
    """`name` of vLLM's imported `module` (one of those the guard imports); ImportError with the guard's reason."""
    why = missing()
    if why:
        raise ImportError(why)
    return getattr(sys.modules[module], name)


def unified_attention():
    return _loaded(UNIFIED, "unified_attention")


def kv_quant_mode():
    """vLLM's `KVQuantMode` enum, as the unified attention's module has it (NONE, FP8_PER_TENSOR, ...)."""
    return _loaded(UNIFIED, "KVQuantMode")


def decode_attention_fwd():
    """vLLM's split-KV decode (`triton_decode_attention.decode_attention_fwd`), as its Triton MLA backend
    calls it."""
    return _loaded(MLA_DECODE, "decode_attention_fwd")


# ---- GDN: vLLM's vendored FLA kernels and its causal_conv1d ------------------------------------------
FLA_OPS = "vllm.third_party.flash_linear_attention.ops"
GDN_MODULES = ("fused_sigmoid_gating", "fused_recurrent", "chunk")  # what qwen_gdn_linear_attn.py calls
# `FLA_OPS/__init__.py` re-exports `RMSNormGated` (layernorm_guard.py), which imports vllm.model_executor and
# through it vllm.distributed (pyzmq, cbor2, ...: vLLM's server dependencies, not installed with --no-deps).
# The kernel modules need none of it, so they are imported under a bare `FLA_OPS` package (its __path__ only),
# taken out of sys.modules afterwards (a later `import FLA_OPS` runs its own __init__ and finds them).


@contextlib.contextmanager
def _bare_package(name: str):
    import pathlib

    parent, _, child = name.rpartition(".")
    importlib.import_module(parent)
    where = pathlib.Path(sys.modules[parent].__path__[0]) / child
    bare = types.ModuleType(name)
    bare.__path__ = [str(where)]
    with _in_sys_modules(name, bare):
        yield


@functools.cache
def gdn_missing(name: str) -> str | None:
    """Why vLLM's FLA kernel module `name` (one of GDN_MODULES) cannot be imported here (None: it can).
    On a CPU only fused_sigmoid_gating imports: fused_recurrent and chunk import FLA's utils, which
    query the CUDA driver at import."""
    why = missing()
    if why:
        return why
    bind = _triton_driver_active() if interpreted() else contextlib.nullcontext()
    bare = contextlib.nullcontext() if FLA_OPS in sys.modules else _bare_package(FLA_OPS)
    try:
        with bind, bare:
            importlib.import_module(f"{FLA_OPS}.{name}")
    except Exception as e:
        return f"vllm's {name} does not import here ({type(e).__name__}: {str(e).splitlines()[0]})"
    return None


def gdn_module(name: str):
    """vLLM's FLA kernel module `name` (one of GDN_MODULES)."""
    why = gdn_missing(name)
    if why:
        raise ImportError(why)
    return sys.modules[f"{FLA_OPS}.{name}"]
