"""The `vllm` backend as the tests of this folder need it: skipped with the import guard's or the backend's
reason where vllm is not installed or cannot run here."""

from __future__ import annotations

import pytest

from attnbench.backend import get_backend
from attnbench.kernels.vllm import _lib


@pytest.fixture(scope="module")
def vllm():
    why = _lib.missing()
    if why:
        pytest.skip(why)
    b = get_backend("vllm")
    if why := b.available():
        pytest.skip(why)
    return b
