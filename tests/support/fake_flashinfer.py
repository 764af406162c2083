"""Run the FlashInfer adapters through FlashInfer's real Python layer on a CPU, with fake kernels.

`fake_kernels(monkeypatch)` replaces every JIT module FlashInfer would compile with a `FakeModule`
that records each call (`(module name, function, args)`) into the current test's `Recorder` and
returns plan infos (FlashInfer caches the modules it loads per process, so a fake created in one
test is reused by the next: it always reports to the recorder of the test running; the names of the
modules loaded go to `Recorder.loaded`, and `forget_modules()` empties those caches), and patches the
few CUDA-only calls the wrappers make on the way (pinned host buffers, device guards, the MLA
wrapper's device queries). The wrappers' own argument handling, validation and plan bookkeeping
run unchanged, so a test sees exactly what the adapters hand to each kernel. An optional `effect`
callback lets a test play the kernel (e.g. write a known LSE into the buffer it was given).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import torch


class FakeModule:
    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def call(*args, **kwargs):
            rec = CURRENT[0]
            if rec is None:
                raise RuntimeError(f"fake FlashInfer kernel {self.name}.{attr} called outside a fake test")
            rec.calls.append((self.name, attr, args))
            if rec.effect is not None:
                rec.effect(self.name, attr, args)
            if attr == "plan":
                return [0] * 32
            if attr == "plan_with_staged_workspace_bytes":
                return [0] * 32, 0
            return None

        return call


class Recorder:
    """The calls the fake kernels received, and the hook a test uses to act as a kernel."""

    def __init__(self):
        self.calls: list[tuple[str, str, tuple]] = []
        self.loaded: list[str] = []  # names of the JIT modules built or loaded (JitSpec.build_and_load)
        self.effect: Callable | None = None

    def clear(self):
        self.calls.clear()
        self.loaded.clear()

    def named(self, attr: str) -> list[tuple[str, tuple]]:
        return [(name, args) for name, a, args in self.calls if a == attr]


CURRENT: list[Recorder | None] = [None]


def forget_modules() -> None:
    """Empty FlashInfer's per-process module caches (its `functools.cache` getters, also those
    behind a wrapper such as `make_hashable_cache`), so that the next wrapper loads every module it
    uses again, through `JitSpec.build_and_load`."""
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "flashinfer" or name.startswith("flashinfer.")):
            continue
        for obj in list(vars(mod).values()):
            for f in (obj, *_closure(obj)):
                if callable(getattr(f, "cache_clear", None)):
                    with contextlib.suppress(TypeError):  # an unbound method of a class
                        f.cache_clear()


def _closure(f) -> list:
    out = []
    for cell in getattr(f, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            out.append(cell.cell_contents)
    return out


def use_scratch_jit_dirs(monkeypatch, root) -> None:
    """Generated sources and ninja files go under `root`, for an sm_90a target, on a GPU-less machine."""
    import flashinfer.jit.core as core
    import flashinfer.jit.env as jit_env

    monkeypatch.setattr(jit_env, "FLASHINFER_GEN_SRC_DIR", root / "generated")
    monkeypatch.setattr(jit_env, "FLASHINFER_JIT_DIR", root / "cached_ops")
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    core.refresh_current_compilation_context()


def fake_kernels(monkeypatch, root) -> Recorder:
    import flashinfer.jit.core as core
    import flashinfer.mla._batch_mla._backends._fa_common as fa_common
    import flashinfer.mla._batch_mla._wrapper as mla_wrapper

    import attnbench.kernels.flashinfer._lib as lib

    use_scratch_jit_dirs(monkeypatch, root)
    rec = Recorder()
    CURRENT[0] = rec

    def build_and_load(spec):
        rec.loaded.append(spec.name)
        return FakeModule(spec.name)

    monkeypatch.setattr(core.JitSpec, "build_and_load", build_and_load)
    real_empty = torch.empty

    def empty(*args, **kwargs):
        kwargs.pop("pin_memory", None)  # pinned host memory needs a CUDA driver
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(lib, "float_workspace", lambda device: real_empty(1 << 20, dtype=torch.uint8))
    # the MLA planner asks the device for its architecture, SM count and shared memory (an H100's)
    monkeypatch.setattr(fa_common, "get_compute_capability", lambda device: (9, 0))
    monkeypatch.setattr(fa_common, "is_sm90a_supported", lambda device: True)
    monkeypatch.setattr(fa_common, "get_device_sm_count", lambda device: 132)
    monkeypatch.setattr(fa_common, "_get_fa_shared_memory_limits", lambda device: (233472, 232448))
    monkeypatch.setattr(mla_wrapper, "_get_compute_capability", lambda device: (9, 0))
    return rec
