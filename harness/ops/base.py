"""The Op contract: what one kernel computes, how its inputs are built, and how it is measured.

An op owns its parameter schema (a frozen pydantic model), its case ids, its inputs (a dataclass of
tensors built deterministically from the case seed), the float64 expectation of every output and side
effect (from references/), and its FLOP and byte counts. The harness never looks inside an op's
tensors beyond what this contract declares.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args, get_origin, get_type_hints

import torch
from pydantic import BaseModel, ConfigDict

from attnbench.ops.rng import to_device


class Params(BaseModel):
    """Base of every op's parameter schema: unknown keys are errors, instances are hashable, and no
    number is NaN or infinite (`sm_scale: .inf` would pass a `gt=0` bound)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)


@dataclass(frozen=True)
class IdField:
    """One token of a case id.

    `prefix` + value(s); several fields join with 'x' (`h32x8`). A bool field is its prefix alone when
    true (`no` + prefix when false and not the default). A Literal field is `prefix` + its value.
    Fields at their default are left out unless `always`.
    """

    prefix: str
    fields: tuple[str, ...]
    always: bool = False


@dataclass(frozen=True)
class OutputSpec:
    """An output the check compares: its dim names (to locate the worst element) and how it compares.

    `exact`: compared bit for bit (integer outputs, cache writes); otherwise with the tolerance rule.
    `floor_units`: name(s) of the op parameters whose sum n is the length of the float32 sums the
    output is computed through (dot products: head_dim for scores, the keys for P.V); their rounding,
    sqrt(n) * u(fp32), joins the rule's floor (harness/check/tolerance.py); None: none.
    `slice_scale`: False for an output whose rounding its own magnitude does not bound (an LSE: the
    error of its score dot products follows sum |q_i k_i|, and cancellation can make |lse| small),
    so its floor keeps the tensor's scale while its twin term is still per slice.
    `magnitude`: the float64 expectation also holds `expected[magnitude_key(name)]`, the same shape,
    the size of the summands each element is a weighted sum of (`sum_j w_j |v_j|`); the floor scales
    with it instead of |ref|, since a sum whose terms cancel is rounded at the size of its terms.
    """

    dims: tuple[str, ...]
    exact: bool = False
    floor_units: str | tuple[str, ...] | None = None
    slice_scale: bool = True  # the floor scales with each slice's max |ref| (False: with the tensor's)
    magnitude: bool = False


@dataclass(frozen=True)
class Perturbation:
    """One class of inputs an op reads, and how it may change between calls (the stale-output check).

    A server rewrites a closure's inputs in place between steps, so a closure must read every input's
    current contents on every call. The stale-output check (harness/check/checks.py `stale_check`) applies
    an op's perturbations to a copy of the inputs, writes them into the closure's buffers in place,
    calls the closure again and requires every output (and written input) to be right for the new
    inputs.

    `name`: the class as messages name it ("queries", "page table"). `fields`: the input fields it
    changes: inputs the case only reads, never an output or an input the case writes (a backend may
    hold those in its own layout from `prepare` on). `apply(p, x)`: changes those fields of `x` in
    place so that `x` stays an input `build_inputs` could have made for the same parameters: values
    only, or metadata (indices, page tables, per-request order) with every buffer consistent with it.
    A perturbation may leave the outputs as they were (a page table permuted with the pages it names);
    then only a closure that cached the old input fails.
    """

    name: str
    fields: tuple[str, ...]
    apply: Callable[[Any, Any], None]


def negate(t: torch.Tensor | None) -> None:
    """In place, exactly, any float dtype (fp8 by its sign bit: some builds have no fp8 arithmetic)."""
    if t is None:
        return
    if t.element_size() == 1 and t.is_floating_point():
        t.view(torch.uint8).bitwise_xor_(0x80)
    else:
        t.neg_()


WEIGHTS = (
    "model weights: constant for a layer, never rewritten between steps (a server calls the same kernel with "
    "each layer's own weights), so a backend may take them as host numbers or precompute from them in prepare "
    "(FlashInfer's run(k_scale=float))"
)
"""Why an op holds a model weight (`Op.held`): fp8 KV scales, attention sinks, GDN gate parameters, conv
weights. The stale-output check follows a server, which rewrites activations and metadata in place."""


def negated(name: str, fields: tuple[str, ...]) -> Perturbation:
    """The perturbation negating every named field that is not None (values: a sign flip keeps a
    distribution's shape, and every output that depends on them changes)."""

    def apply(p, x) -> None:
        for f in fields:
            negate(getattr(x, f))

    return Perturbation(name, fields, apply)


def rolled(name: str, fields: tuple[str, ...], dim: int = 0) -> Perturbation:
    """The perturbation rotating every named field by one along `dim` (per-request metadata such as
    slot indices: request b takes request b-1's; a no-op for a batch of one)."""

    def apply(p, x) -> None:
        for f in fields:
            t = getattr(x, f)
            if t is not None:
                t.copy_(t.roll(1, dim))

    return Perturbation(name, fields, apply)


def tensor_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes of a dense tensor of `shape` and `dtype`."""
    return math.prod(shape) * dtype.itemsize


def magnitude_key(name: str) -> str:
    """The key of an output's summand magnitude in the float64 expectation (`OutputSpec.magnitude`)."""
    return f"{name}.magnitude"


@dataclass(frozen=True)
class SmokeSpace:
    """An op's part of the generated `smoke` suite (harness/ops/coverage.py: every pair of values of two
    axes in at least one case). Literal and bool fields of `Params` are axes over all their values by
    themselves; every other field needs values here or a held value with its reason.

    - `space`: field -> values; `"a,b"` ties fields into one compound axis of tuples (only some tuples
      are meaningful); `"dtype"` the case dtypes.
    - `held`: field -> (its one value in smoke, why it is not an axis).
    - `seeds`: cases every plan starts from (axis -> value; axes left out take their first value).
    - `seed_ids`: case ids other tests and CI expectations name, kept in smoke as seeds.
    """

    space: dict[str, list[Any]]
    held: dict[str, tuple[Any, str]] = field(default_factory=dict)
    seeds: list[dict[str, Any]] = field(default_factory=list)
    seed_ids: list[str] = field(default_factory=list)


_REQUIRED_ATTRIBUTES = ("family", "Params", "id_fields", "outputs")
_REQUIRED_METHODS = ("build_inputs", "input_bytes", "expected", "perturbations")


class Op:
    """Base class of op contracts. Subclasses set the class attributes and implement the methods.

    A class that sets `name` is a concrete op: defining it without `family`, `Params`, `id_fields`,
    `outputs` or its own `build_inputs`, `input_bytes`, `expected` and `perturbations` is a TypeError at import (classes
    without a `name` are shared bases and are not checked).
    """

    name: ClassVar[str]
    family: ClassVar[str]
    Params: ClassVar[type[Params]]
    id_fields: ClassVar[tuple[IdField, ...]]
    outputs: ClassVar[dict[str, OutputSpec]]
    # read inputs no perturbation changes, each with why (the stale-output check leaves them alone)
    held: ClassVar[dict[str, str]] = {}
    # its part of the generated smoke suite (harness/ops/coverage.py); None: the op is not in smoke
    smoke: ClassVar[SmokeSpace | None] = None
    # servers capture this op in CUDA graphs (once per padded batch-size bucket) and replay it on other
    # batches written into the captured tensors in place: the replay check (docs/replay.md) applies, and
    # `replay_batch` builds the other batch (harness/ops/replay_batches.py)
    graph_captured: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" not in vars(cls):
            return
        missing = [a for a in _REQUIRED_ATTRIBUTES if not hasattr(cls, a)]
        missing += [f"{m}()" for m in _REQUIRED_METHODS if getattr(cls, m) is getattr(Op, m)]
        if missing:
            raise TypeError(f"op {cls.name!r} ({cls.__module__}.{cls.__qualname__}) lacks {', '.join(missing)}")

    # ---- parameters -------------------------------------------------------------------------
    def features(self, p: Params) -> tuple[str, ...]:
        """Feature tags of a case (for the capability matrix), e.g. ('gqa', 'paged', 'swa')."""
        return ()

    def outputs_for(self, p: Params) -> dict[str, OutputSpec]:
        """The outputs of this case: `outputs` (every output the op can have), or those of a mode that has
        fewer (causal_conv1d's `intermediate_conv_windows` exists in verify mode only)."""
        return self.outputs

    def writes_for(self, p: Params) -> dict[str, OutputSpec]:
        """Inputs this case writes (side effects), each compared with its expected final value."""
        return {}

    def checked_names(self, p: Params) -> list[str]:
        """Everything a check of this case compares, by name: its outputs, then the inputs it writes (the
        names a failure's problems start with, `check.checks.subjects`)."""
        return [*self.outputs_for(p), *self.writes_for(p)]

    def written_rows(self, p: Params, inputs: Any) -> dict[str, int]:
        """Written inputs whose expectation covers only rows `[start:]` of dim 0, by name (a production-size
        pool whose requests all sit at its end, `pool_pages` / `state_slots`): the check compares those rows
        with the expectation and requires every row before `start` bitwise unchanged. Default: none."""
        return {}

    def unspecified(self, p: Params, inputs: Any) -> dict[str, torch.Tensor]:
        """Output elements the contract leaves open, by output name: bool masks broadcastable to the
        output, True where any value is fine (e.g. rows of padding requests). They are not compared."""
        return {}

    def row_requests(self, p: Params, inputs: Any) -> torch.Tensor | None:
        """The request of each row of outputs whose first dim is `token` (`[T]` int), so tolerance bounds
        apply per (request, head) slice; None when rows are not grouped into requests (per head only)."""
        return None

    # ---- inputs and expectations -------------------------------------------------------------
    def make_inputs(self, p: Params, dtype: torch.dtype, seed: int, device: torch.device) -> Any:
        """The case's inputs on `device`: built on the CPU by `build_inputs`, then moved, so a case id
        gives the same bits on any device (harness/ops/rng.py)."""
        return to_device(self.build_inputs(p, dtype, seed, torch.device("cpu")), device)

    def build_inputs(self, p: Params, dtype: torch.dtype, seed: int, device: torch.device) -> Any:
        """The inputs dataclass, built deterministically from `seed` alone on `device` (the CPU).

        Draw data with CPU generators (`attnbench.ops.rng.randn` for anything large); outputs are
        allocated NaN-filled and canary-padded (`attnbench.buffers.alloc_output`).
        """
        raise NotImplementedError

    def input_bytes(self, p: Params, dtype: torch.dtype, seed: int) -> int:
        """Bytes of the tensors `build_inputs` returns (outputs and their canary padding included),
        from the parameters alone: no tensor is built (`--dry-run` sizes cases and flags those that
        cannot fit the device). Sum `tensor_bytes` / `attnbench.buffers.output_bytes` over the fields."""
        raise NotImplementedError

    def expected(self, p: Params, inputs: Any, precision: torch.dtype) -> dict[str, torch.Tensor]:
        """Every output and every written input as the math says, computed in `precision`.

        float64 is the reference; the case dtype gives the native-precision twin that the tolerance
        rule scales from. Returned tensors may be float64 regardless of the outputs' dtypes.
        """
        raise NotImplementedError

    def subset(self, p: Params, inputs: Any, order: list[int]) -> tuple[Any, torch.Tensor] | None:
        """The same data with only the requests in `order` (in that order), for batch-invariance checks.

        Returns (new inputs with fresh outputs, index of each new output row in the original outputs),
        or None when the op has no notion of independent requests. Outputs' first dim is the row dim.
        """
        return None

    def replay_batch(self, p: Params, x: Any, dtype: torch.dtype, seed: int) -> tuple[Params, Any] | str:
        """Another batch of the same CUDA-graph bucket as `x` (the replay check, docs/replay.md): `(its
        params, its inputs)`, every tensor of the inputs the shape, dtype and device of `x`'s, with other
        per-request lengths, page tables, slots and data where the op has them, and a padding request
        where it supports padding; model weights and the inputs the case writes (pools) are `x`'s as
        they are now (`replay_kept`). A string: why this case has none. Only ops with `graph_captured`
        are asked."""
        return f"{self.name} is not captured in CUDA graphs"

    def replay_kept(self, p: Params) -> tuple[str, ...]:
        """The fields batch B (`replay_batch`) takes from `x` as they are now, every other field being a
        function of `(p, dtype, seed)` alone: model weights (`held` as WEIGHTS), the inputs the case
        writes and the state pools it holds. The replay check draws B once per case and gives each
        backend's row these fields from its own inputs (harness/check/replay.py `batch_b`)."""
        weights = [n for n, why in self.held.items() if why is WEIGHTS]
        pools = [n for n in self.held if n == "state_pool"]
        return tuple(dict.fromkeys([*weights, *self.writes_for(p), *pools]))

    def perturbations(self, p: Params) -> tuple[Perturbation, ...]:
        """Every class of inputs this case reads, each with a valid in-place change (`Perturbation`).

        Together with `held` (read inputs left alone, with why) they name every tensor input the case
        reads that is neither an output nor written (tests/harness/test_stale_check.py holds each op to it).
        """
        raise NotImplementedError

    # ---- cost model (documented in docs/conventions.md) ---------------------------------------
    def flops(self, p: Params, inputs: Any) -> float:
        return 0.0

    def bytes(self, p: Params, inputs: Any) -> float:
        return 0.0

    # ---- case ids ------------------------------------------------------------------------------
    def id_tokens(self, p: Params) -> list[str]:
        """Readable id tokens, in `id_fields` order; fields at their default are left out unless `always`."""
        defaults = type(p)()
        tokens = []
        for f in self.id_fields:
            values = [getattr(p, name) for name in f.fields]
            if not f.always and all(getattr(defaults, n) == v for n, v in zip(f.fields, values)):
                continue
            while values and values[-1] is None:  # optional trailing fields (head_dim_v) drop out
                values.pop()
            if not values:
                continue
            if len(values) == 1 and isinstance(values[0], bool):
                tokens.append(f.prefix if values[0] else "no" + f.prefix)
                continue
            tokens.append(f.prefix + "x".join(_fmt(v) for v in values))
        return tokens

    def parse_id_tokens(self, tokens: list[str]) -> dict[str, Any]:
        """Inverse of `id_tokens`: the parameter values the tokens name (the rest keep defaults)."""
        out: dict[str, Any] = {}
        hints = get_type_hints(self.Params)  # resolves postponed annotations (type aliases)
        for tok in tokens:
            for f in sorted(self.id_fields, key=lambda f: -len(f.prefix)):
                ann = hints[f.fields[0]]
                if ann is bool:
                    if tok in (f.prefix, "no" + f.prefix):
                        out[f.fields[0]] = tok == f.prefix
                        break
                    continue
                choices = get_args(ann) if get_origin(ann) is Literal else ()
                if not tok.startswith(f.prefix):
                    continue
                rest = tok[len(f.prefix) :]
                parts = rest.split("x") if len(f.fields) > 1 else [rest]
                ok = (
                    (rest in choices)
                    if choices
                    else (
                        len(parts) <= len(f.fields) and all(re.fullmatch(r"-?\d+(\.\d*)?(e-?\d+)?", s) for s in parts)
                    )
                )
                if ok:
                    out.update(zip(f.fields, parts))
                    break
            else:
                raise ValueError(f"unknown token {tok!r} in a {self.name} case id")
        return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):  # short when exact, else the shortest repr that round-trips
        return f"{v:g}" if float(f"{v:g}") == v else repr(v)
    return str(v)
