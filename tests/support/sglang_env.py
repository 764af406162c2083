"""Make SGLang's kernel modules importable in CPU test environments, or skip with the reason.

`sglang.srt.utils.common` (imported by every SGLang kernel file) imports `torchvision.io.decode_jpeg`
at module level, for multimodal inputs. PyPI's torchvision wheels link the CUDA build of torch and
do not load against a CPU torch, and the CPU builds are not on PyPI. So, where torchvision itself
does not import, this registers an empty `torchvision.io` whose `decode_jpeg` raises: no kernel
calls it, and the kernels attnbench drives are SGLang's own. GPU machines have a real torchvision.
Tests only: the backend never does this (its import guard reports the missing module instead).
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest


def _torchvision_imports() -> bool:
    try:
        import torchvision.io  # noqa: F401
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        return False
    return True


def _register_image_decoder_stand_in() -> None:
    def decode_jpeg(*args, **kwargs):
        raise RuntimeError("torchvision is not usable here (tests/support/sglang_env.py): no JPEG decoding")

    tv, io = types.ModuleType("torchvision"), types.ModuleType("torchvision.io")
    io.decode_jpeg = decode_jpeg
    tv.io = io
    sys.modules["torchvision"], sys.modules["torchvision.io"] = tv, io


def sglang_kernels_or_skip() -> None:
    """Import SGLang's kernel modules (through the backend's guard) or skip the test with why."""
    from attnbench.kernels.sglang import _lib

    if importlib.util.find_spec("sglang") is None:
        pytest.skip(f"sglang is not installed; {_lib.INSTALL}")
    if not _torchvision_imports():
        _register_image_decoder_stand_in()
    _lib.missing.cache_clear()
    why = _lib.missing()
    if why:
        pytest.skip(why)


def sglang_backend_or_skip(name: str = "sglang"):
    """The registered backend `name` (sglang, sglang-unified, ...) with SGLang's kernels importable, or
    skip the test with why (the kernels missing, or the backend unavailable here)."""
    from attnbench.backend import get_backend

    sglang_kernels_or_skip()
    b = get_backend(name)
    if why := b.available():
        pytest.skip(why)
    return b
