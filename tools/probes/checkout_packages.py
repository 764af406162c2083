"""Make `attnbench.kernels.triton` importable from this checkout without installing attnbench (a bare GPU
machine has torch and triton only): bare package modules for `attnbench`, `attnbench.kernels` and
`attnbench.kernels.triton` pointing at harness/, kernels/ and kernels/triton/, so importing a kernel
module runs that module alone, not the packages' registries. Import it before any attnbench module."""

from __future__ import annotations

import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for name, path in [
    ("attnbench", "harness"),
    ("attnbench.kernels", "kernels"),
    ("attnbench.kernels.triton", "kernels/triton"),
]:
    if name not in sys.modules:
        mod = types.ModuleType(name)
        mod.__path__ = [os.path.join(ROOT, path)]
        sys.modules[name] = mod
