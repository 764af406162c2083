"""Backends, their declared implementations, and their one registry.

A backend adapts one kernel library to the canonical semantics. Each op it runs is ONE declared
implementation: the method that prepares it, marked with `@implements(op, limits=..., jit_keys=...)`.
The decorator only records; everything that asks "does backend B run case C, and if not, why"
(`supports()`, the capability matrix of `attnbench list backends`, the sweep's precompile) reads that
one declaration:

- `limits(backend, case) -> str | None`: why this implementation cannot run `case` (None: it can),
  decided from the case alone (parameters, dtype, device), never from a GPU being present; machine
  limits (library missing, no GPU, wrong architecture) belong to `available()`, and limits shared by
  every op of a backend (e.g. the case must be on CUDA) to the class attribute `backend_limits`.
- `jit_keys(backend, case) -> list[Hashable]`: the modules `prepare` would compile for `case`, which
  the sweep hands, for every backend of a family at once, to the class's `precompile` before the cases.

The prepare method does everything that is not the kernel (layout conversion, allocation, plan(),
JIT, compilation) and returns the zero-argument closure that is the only thing timed. The closure must
read the *current contents* of the input tensors on every call (the harness perturbs them in place to
catch stale outputs, and rotates them when timing) and return a dict of the op's outputs, normally the
preallocated `inputs.o`, `inputs.lse`, ... it wrote. A closure may carry an `info` dict attribute
(e.g. `{"jit_s": 12.1, "plan_s": 0.002, "variant": "fa3"}`) that the result row records as
`prepare_info`. `attnbench.errors.Unsupported` raised in `prepare` still turns a case into a skip,
for what only the library or the process can tell late (a planner refusing, a module name taken);
anything decidable from the case belongs in `limits`, so the capability matrix says what runs.

More optional closure attributes, so that only the kernel is timed and checked as a server runs it:

- `finalize(outputs) -> outputs`: a backend that holds an op's stateful inputs in its library's
  native layout from `prepare` on (e.g. GDN states `[N, HV, V, K]`, converted once from the
  canonical pool) converts them back here: the runner calls `finalize` after every call it checks
  (never inside the timed window), with what the closure returned, and checks what `finalize`
  returns and the inputs it wrote back (`work.state_pool`, ...). The closure itself then contains
  only the library call.
- `absent: dict[str, str]`: outputs of the op the library's kernel does not produce (name -> why,
  e.g. `{"lse": "SGLang's extend kernel writes no LSE"}`). They are not checked; the row records
  them in `prepare_info["absent"]`. Every other output must be there.
- `before_replay() -> Any`: the host-side step a server runs before each CUDA-graph replay to refill
  the graph's static buffers from the batch's device tensors (SGLang's
  `init_forward_metadata_replay_cuda_graph`: token tables, split counts). The replay check calls it
  after writing batch B into the closure's inputs and before replaying; it is never timed and never
  captured. A closure whose plan must follow the batch and has no such step is not graph-safe.
- `planned: dict[str, str]`: inputs the library consumes once, in `prepare` (its plan), as a server
  does once per batch (name -> why, e.g. `{"custom_mask": "packed into the plan's buffer by
  plan()"}`): the stale check does not change them in place (it changes every other input the op
  reads); the row records them in `prepare_info["planned"]`.

Built-in backends register exactly as plugins do::

    import attnbench
    from attnbench.backend import implements

    def decode_limits(backend, case):
        return "head_dim 128 only" if case.params.head_dim != 128 else None

    @attnbench.register_backend("mykernel")
    class MyKernel(attnbench.Backend):
        @implements("decode", limits=decode_limits)
        def prepare_decode(self, case, x):
            def run():
                my_decode(x.q, x.k_cache, x.v_cache, x.kv_indptr, x.kv_page_indices, x.seq_lens, out=x.o, lse=x.lse)
                return {"o": x.o, "lse": x.lse}
            return run

A plain method named `prepare_<op>` (no decorator) still declares `op`, with no limits: plugins
written that way keep working, and may refine `supports(case)` themselves.
"""

from __future__ import annotations

import copy
import fnmatch
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from attnbench.errors import AttnbenchError

if TYPE_CHECKING:
    import torch

    from attnbench.case import Case

Closure = Callable[[], dict[str, "torch.Tensor"]]
Limits = Callable[["Backend", "Case"], "str | None"]
JitKeys = Callable[["Backend", "Case"], "list[Hashable]"]
GraphSafe = Callable[["Backend", "Case"], "bool | str"]  # a per-case declaration (`implements(graph_safe=...)`)

_MARK = "__attnbench_implements__"


@dataclass(frozen=True)
class Implementation:
    """One op of one backend: the method that prepares it, its limits and its JIT keys."""

    op: str
    method: str  # the backend's attribute called as method(case, inputs)
    limits: Limits | None = None
    jit_keys: JitKeys | None = None
    state_layout: str | Callable[[Backend], str | None] | None = None  # see `implements`
    graph_safe: bool | str | GraphSafe | None = None  # see `implements`

    def reason(self, backend: Backend, case: Case) -> str | None:
        return self.limits(backend, case) if self.limits else None

    def keys(self, backend: Backend, case: Case) -> list[Hashable]:
        return list(self.jit_keys(backend, case)) if self.jit_keys else []


def implements(
    *ops: str,
    limits: Limits | None = None,
    jit_keys: JitKeys | None = None,
    state_layout: str | Callable[[Backend], str | None] | None = None,
    graph_safe: bool | str | GraphSafe | None = None,
) -> Callable:
    """Method decorator: declares the method as the backend's implementation of `ops` (one or more op
    names, e.g. `"extend", "tree_verify"` when one path serves both), with its case-level `limits` and
    `jit_keys` (both called as `f(backend, case)`). It only records: the method is returned unchanged.
    Unknown op names are an error when the backend class is defined.

    `state_layout`: the memory layout in which the kernel addresses the op's state pool (GDN: `"kv"`
    `[N, HV, K, V]` or `"vk"` `[N, HV, V, K]`, kernels/native_states.py), declaring that the prepared
    closure works on a pool handed to it in that layout (`inputs.state_layout`) as it is, at call time,
    with no private copy: what a chain of ops by several backends over one pool needs (docs/chain.md).
    None: the implementation takes only the canonical pool, converted per op. A callable
    `f(backend)` gives the layout per variant (a knob that moves the kernels to another layout);
    read it through `Backend.state_layout(op)`.

    `graph_safe`: whether the prepared closure may be captured in a CUDA graph once and replayed on
    other batches of the same shapes written into its inputs in place, as a server replays decode and
    verify (the replay check, docs/replay.md). True: it may (every launch reads lengths, page tables,
    slots and masks from the device tensors, and nothing in `call` depends on host values of one
    batch; what `prepare` plans from the case's shapes alone is fine). A string: it may not, and why
    (e.g. a split schedule planned from the batch's lengths in `prepare`); the check is a skip with
    that reason. A callable `f(backend, case) -> bool | str` decides per case. None (the default):
    not declared, a skip."""
    if not ops:
        raise TypeError("implements() needs at least one op name")

    def deco(fn: Callable) -> Callable:
        marks = getattr(fn, _MARK, ())
        setattr(fn, _MARK, (*marks, (ops, limits, jit_keys, state_layout, graph_safe)))
        return fn

    return deco


def all_of(*rules: Limits) -> Limits:
    """A limits rule that returns the first reason of `rules` (None when every rule allows the case)."""

    def first(backend: Backend, case: Case) -> str | None:
        for rule in rules:
            if reason := rule(backend, case):
                return reason
        return None

    return first


def _declared(cls: type) -> dict[str, Implementation]:
    """Every op `cls` implements: marked methods and plain `prepare_<op>` methods, the most derived
    class's definition winning (mixins included, in MRO order)."""
    from attnbench.ops import OPS

    found: dict[str, Implementation] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            marks = getattr(value, _MARK, None)
            if marks:
                for ops, limits, jit_keys, state_layout, graph_safe in marks:
                    for op in ops:
                        if op not in OPS:
                            raise TypeError(
                                f"{cls.__qualname__}.{attr}: @implements({op!r}) names no op; "
                                f"ops: {', '.join(sorted(OPS))}"
                            )
                        found[op] = Implementation(op, attr, limits, jit_keys, state_layout, graph_safe)
            elif attr.startswith("prepare_") and attr[len("prepare_") :] in OPS and callable(value):
                found[attr[len("prepare_") :]] = Implementation(attr[len("prepare_") :], attr)
    return found


@dataclass(frozen=True)
class Knob:
    """One of a backend's own tunables, declared once on its class (`knobs = {"name": Knob(...)}`) and
    chosen per run with `-b NAME:knob=value[,knob=value]`: the variant's label, `NAME[knob=value]`, is its
    backend name everywhere (rows, summaries, reports, compare keys). `choices`: the allowed values."""

    help: str
    choices: tuple[Any, ...]

    def parse(self, backend: str, name: str, text: str) -> Any:
        for value in self.choices:
            if str(value) == text:
                return value
        allowed = ", ".join(str(c) for c in self.choices)
        raise AttnbenchError(f"backend {backend!r}: knob {name}={text!r} is not allowed; choose one of {allowed}")


class Backend:
    """Base class of every backend (built-in or plugin).

    Subclasses declare one implementation per op (`@implements(op, limits=..., jit_keys=...)` on its
    prepare method, or a plain `prepare_<op>` method), and may refine `available()` (the library is
    missing, no GPU) and `backend_limits` (case-level limits shared by every op).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    implementations: ClassVar[dict[str, Implementation]] = {}
    backend_limits: ClassVar[Limits | None] = None  # called as backend_limits(self, case) before the op's limits
    knobs: ClassVar[dict[str, Knob]] = {}  # the backend's own tunables (`-b NAME:knob=value`)
    settings: dict[str, Any] = {}  # the knob values of this variant ({}: the backend's defaults); read in prepare

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.implementations = _declared(cls)

    @property
    def ops(self) -> frozenset[str]:
        """Ops this backend implements (its declared implementations)."""
        return frozenset(self.implementations)

    def available(self) -> str | None:
        """Why this backend cannot run on this machine at all (None: it can)."""
        return None

    def limits(self, case: Case) -> str | None:
        """Why the declared implementation cannot run `case`, from the case alone (None: it can, or
        the backend has no implementation of the op). No GPU is needed to decide."""
        impl = self.implementations.get(case.op_name)
        if impl is None:
            return None
        rule = type(self).backend_limits
        return (rule(self, case) if rule else None) or impl.reason(self, case)

    def supports(self, case: Case) -> str | None:
        """None when the backend can run `case`, else the reason (shown in the capability matrix)."""
        if case.op_name not in self.implementations:
            return f"{self.name} has no {case.op_name} kernel"
        return self.available() or self.limits(case)

    def graph_safe(self, case: Case) -> bool | str | None:
        """Whether the implementation of `case`'s op declares its closure safe to capture in a CUDA graph
        and replay on other batches (`implements(graph_safe=...)`): True, why not (a string), or None
        (not declared)."""
        impl = self.implementations.get(case.op_name)
        decl = impl.graph_safe if impl else None
        return decl(self, case) if callable(decl) else decl

    def state_layout(self, op: str) -> str | None:
        """The layout in which this variant's implementation of `op` addresses the op's state pool
        (`implements(state_layout=...)`, resolved for the variant's knobs); None: canonical pool only."""
        impl = self.implementations.get(op)
        decl = impl.state_layout if impl else None
        return decl(self) if callable(decl) else decl

    def jit_keys(self, case: Case) -> list[Hashable]:
        """What `prepare` would compile for `case` (its implementation's declared `jit_keys`)."""
        impl = self.implementations.get(case.op_name)
        return impl.keys(self, case) if impl else []

    def precompile_keys(self, cases: list[Case]) -> list[Hashable]:
        """What `prepare` would compile for these (supported) cases, named, for `precompile`."""
        return [k for case in cases for k in self.jit_keys(case)]

    @classmethod
    def precompile(cls, keys: list[Hashable]) -> str:
        """Compile `keys` in one batch before a sweep's cases run (they come from every backend of the
        sweep that shares this method, without duplicates); returns a one-line summary. Called once in
        the supervisor, never timed. It may raise: the sweep then reports it and goes on, and each
        `prepare` compiles what it needs on its own."""
        return ""

    def prepare(self, case: Case, inputs: Any) -> Closure:
        """Everything but the kernel; returns the closure that is timed."""
        impl = self.implementations.get(case.op_name)
        if impl is None:
            raise NotImplementedError(f"{self.name} has no {case.op_name} kernel")
        return getattr(self, impl.method)(case, inputs)


_REGISTRY: dict[str, type[Backend]] = {}
_INSTANCES: dict[str, Backend] = {}
LOAD_PROBLEMS: list[str] = []  # plugins that failed to load, for the CLI and the report


_ORIGINS: dict[str, str | None] = {}  # name -> the source file of the module that registered it


def _file_of(cls: type) -> str | None:
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    return str(Path(path).resolve()) if path else None


def _origin(cls: type, file: str | None = None) -> tuple[str, str, str | None]:
    """What makes two registrations the same one: module, class and the module's source file (a module
    imported again, e.g. reloaded, registers its class again; another module never takes the name)."""
    return cls.__module__, cls.__qualname__, file if file is not None else _file_of(cls)


def _describe(cls: type, file: str | None = None) -> str:
    where = file if file is not None else _file_of(cls)
    return f"{cls.__module__}.{cls.__qualname__}" + (f" ({where})" if where else "")


def register_backend(name: str) -> Callable[[type[Backend]], type[Backend]]:
    """Class decorator: register `cls` under `name` (returns the class unchanged)."""

    def deco(cls: type[Backend]) -> type[Backend]:
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise TypeError(f"register_backend({name!r}) needs a subclass of attnbench.Backend, got {cls!r}")
        old = _REGISTRY.get(name)
        if old is not None and _origin(old, _ORIGINS.get(name)) != _origin(cls):
            raise AttnbenchError(
                f"backend name {name!r} is taken by {_describe(old, _ORIGINS.get(name))}; "
                f"{_describe(cls)} cannot register it too (choose another name)"
            )
        cls.name = name
        _REGISTRY[name] = cls
        _ORIGINS[name] = _file_of(cls)
        _INSTANCES.pop(name, None)
        return cls

    return deco


def _load_failure(e: BaseException) -> str:
    if isinstance(e, SystemExit):
        return f"SystemExit({e.code!r}) while importing it (sys.exit() at module level?)"
    return f"{type(e).__name__}: {e}"


def load_builtin() -> None:
    """Import the built-in backend packages (each imports with or without its optional library)."""
    importlib.import_module("attnbench.kernels")


def load_entry_points() -> None:
    """Import installed plugins of the entry-point group `attnbench.backends`."""
    for ep in importlib.metadata.entry_points(group="attnbench.backends"):
        try:
            ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # a broken plugin (even one calling sys.exit) must not stop the sweep
            LOAD_PROBLEMS.append(f"entry point {ep.name} ({ep.value}): {_load_failure(e)}")


def load_plugin(spec: str) -> None:
    """Import a user's backend module: a path to a .py file or a module name. Failures are recorded in
    LOAD_PROBLEMS, whatever the module raises (SystemExit from a `sys.exit()` at module level, a bare
    BaseException) except KeyboardInterrupt, which still stops the program."""
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
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        LOAD_PROBLEMS.append(f"plugin {spec}: {_load_failure(e)}")


def all_backends() -> dict[str, Backend]:
    """Every registered backend, by name (instances are shared)."""
    for name, cls in _REGISTRY.items():
        if name not in _INSTANCES:
            _INSTANCES[name] = cls()
    return {name: _INSTANCES[name] for name in sorted(_REGISTRY)}


_VARIANTS: dict[str, Backend] = {}


def parse_backend(spec: str) -> tuple[str, dict[str, str]]:
    """`NAME`, `NAME:k=v,k2=v2` or the label form `NAME[k=v,k2=v2]` -> (NAME, {k: v} as text)."""
    if spec.endswith("]") and "[" in spec:
        base, _, rest = spec[:-1].partition("[")
    else:
        base, _, rest = spec.partition(":")
    pairs = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise AttnbenchError(f"backend {spec!r}: knob settings are k=v pairs separated by commas, got {item!r}")
        pairs[key.strip()] = value.strip()
    return base.strip(), pairs


def is_pattern(spec: str) -> bool:
    """Whether a `-b` argument is a shell-style pattern over the registered names (not a name or variant)."""
    return any(ch in spec for ch in "*?") and ":" not in spec and "[" not in spec


def expand_backend_args(specs: list[str]) -> list[tuple[str, list[Backend]]]:
    """Each `-b` argument with the backends it selects, in order: a name or knob variant one backend, a
    pattern every registered name it matches (none: an error naming the backends)."""
    out = []
    for spec in specs:
        if is_pattern(spec):
            names = fnmatch.filter(all_backends(), spec)
            if not names:
                raise AttnbenchError(f"no backend matches {spec!r}; available: {', '.join(all_backends()) or 'none'}")
            out.append((spec, [get_backend(n) for n in names]))
        else:
            out.append((spec, [get_backend(spec)]))
    return out


def select_backends(specs: list[str]) -> list[Backend]:
    """The backends named on a command line, in order, once each: names, knob variants (`NAME:k=v`)
    and shell-style patterns over the registered names (`'flashinfer*'`, `'triton*'`)."""
    chosen: dict[str, Backend] = {}
    for _, found in expand_backend_args(specs):
        chosen.update((b.name, b) for b in found)
    return list(chosen.values())


def get_backend(name: str) -> Backend:
    """The registered backend `name`, or its variant with knob settings (`NAME:k=v` or `NAME[k=v]`)."""
    found = all_backends()
    if name in found:  # a registered name, `:` and all (plugin variants such as `cute-decode:wide`)
        return found[name]
    base, raw = parse_backend(name)
    if base not in found:
        raise AttnbenchError(f"unknown backend {base!r}; available: {', '.join(found) or 'none'}")
    b = found[base]
    if not raw:
        return b
    settings = {}
    for key, text in raw.items():
        knob = b.knobs.get(key)
        if knob is None:
            valid = ", ".join(f"{k} ({', '.join(map(str, v.choices))})" for k, v in b.knobs.items()) or "none"
            raise AttnbenchError(f"backend {base!r} has no knob {key!r}; its knobs: {valid}")
        settings[key] = knob.parse(base, key, text)
    label = f"{base}[{','.join(f'{k}={settings[k]}' for k in sorted(settings))}]"
    if label not in _VARIANTS:
        variant = copy.copy(b)
        variant.name, variant.settings = label, settings
        _VARIANTS[label] = variant
    return _VARIANTS[label]
