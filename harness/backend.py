"""Backends and their one registry.

A backend adapts one kernel library to the canonical semantics. `supports(case)` says why it cannot
run a case (None when it can); `prepare(case, inputs)` does everything that is not the kernel (layout
conversion, allocation, plan(), JIT, compilation) and returns the zero-argument closure that is the
only thing timed. The closure must read the *current contents* of the input tensors on every call
(the harness perturbs them in place to catch stale outputs, and rotates them when timing) and
return a dict of the op's outputs, normally the preallocated `inputs.o`, `inputs.lse`, ... it wrote.
A closure may carry an `info` dict attribute (e.g. `{"jit_s": 12.1, "plan_s": 0.002, "variant": "fa3"}`)
that the result row records as `prepare_info`. Raise `attnbench.errors.Unsupported` in `prepare` to
turn a case into a skip when support is only known late.

Built-in backends register exactly as plugins do::

    import attnbench

    @attnbench.register_backend("mykernel")
    class MyKernel(attnbench.Backend):
        def prepare_decode(self, case, x):
            def run():
                my_decode(x.q, x.k_cache, x.v_cache, x.kv_indptr, x.kv_page_indices, x.seq_lens, out=x.o, lse=x.lse)
                return {"o": x.o, "lse": x.lse}
            return run
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from attnbench.errors import AttnbenchError

if TYPE_CHECKING:
    import torch

    from attnbench.case import Case

Closure = Callable[[], dict[str, "torch.Tensor"]]


class Backend:
    """Base class of every backend (built-in or plugin).

    Subclasses implement `prepare_<op>(case, inputs)` per op they support (or override `prepare`),
    and may refine `available()` (the library is missing, no GPU) and `supports(case)`.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @property
    def ops(self) -> frozenset[str]:
        """Ops this backend implements (those with a `prepare_<op>` method)."""
        from attnbench.ops import OPS

        return frozenset(op for op in OPS if callable(getattr(self, f"prepare_{op}", None)))

    def available(self) -> str | None:
        """Why this backend cannot run on this machine at all (None: it can)."""
        return None

    def supports(self, case: Case) -> str | None:
        """None when the backend can run `case`, else the reason (shown in the capability matrix)."""
        if case.op_name not in self.ops:
            return f"{self.name} has no {case.op_name} kernel"
        return self.available()

    def precompile_keys(self, cases: list[Case]) -> list[Hashable]:
        """What `prepare` would compile for these (supported) cases, named, for `precompile`. Default: nothing."""
        return []

    @classmethod
    def precompile(cls, keys: list[Hashable]) -> str:
        """Compile `keys` in one batch before a sweep's cases run (they come from every backend of the
        sweep that shares this method, without duplicates); returns a one-line summary. Called once in
        the supervisor, never timed. It may raise: the sweep then reports it and goes on, and each
        `prepare` compiles what it needs on its own."""
        return ""

    def prepare(self, case: Case, inputs: Any) -> Closure:
        """Everything but the kernel; returns the closure that is timed."""
        fn = getattr(self, f"prepare_{case.op_name}", None)
        if fn is None:
            raise NotImplementedError(f"{self.name} has no {case.op_name} kernel")
        return fn(case, inputs)


_REGISTRY: dict[str, type[Backend]] = {}
_INSTANCES: dict[str, Backend] = {}
LOAD_PROBLEMS: list[str] = []  # plugins that failed to load, for the CLI and the report


def register_backend(name: str) -> Callable[[type[Backend]], type[Backend]]:
    """Class decorator: register `cls` under `name` (returns the class unchanged)."""

    def deco(cls: type[Backend]) -> type[Backend]:
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise TypeError(f"register_backend({name!r}) needs a subclass of attnbench.Backend, got {cls!r}")
        old = _REGISTRY.get(name)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise AttnbenchError(f"backend name {name!r} is taken by {old.__module__}.{old.__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        _INSTANCES.pop(name, None)
        return cls

    return deco


def load_builtin() -> None:
    """Import the built-in backend packages (each imports with or without its optional library)."""
    importlib.import_module("attnbench.kernels")


def load_entry_points() -> None:
    """Import installed plugins of the entry-point group `attnbench.backends`."""
    for ep in importlib.metadata.entry_points(group="attnbench.backends"):
        try:
            ep.load()
        except Exception as e:  # a broken plugin must not stop the sweep
            LOAD_PROBLEMS.append(f"entry point {ep.name} ({ep.value}): {type(e).__name__}: {e}")


def load_plugin(spec: str) -> None:
    """Import a user's backend module: a path to a .py file or a module name. Failures are recorded."""
    try:
        path = Path(spec)
        if path.suffix == ".py" or path.exists():
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {spec}")
            mod_name = f"attnbench_plugin_{path.stem}"
            mspec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(mspec)
            sys.modules[mod_name] = module
            mspec.loader.exec_module(module)
        else:
            importlib.import_module(spec)
    except Exception as e:
        LOAD_PROBLEMS.append(f"plugin {spec}: {type(e).__name__}: {e}")


def all_backends() -> dict[str, Backend]:
    """Every registered backend, by name (instances are shared)."""
    for name, cls in _REGISTRY.items():
        if name not in _INSTANCES:
            _INSTANCES[name] = cls()
    return {name: _INSTANCES[name] for name in sorted(_REGISTRY)}


def get_backend(name: str) -> Backend:
    found = all_backends()
    if name not in found:
        raise AttnbenchError(f"unknown backend {name!r}; available: {', '.join(found) or 'none'}")
    return found[name]
