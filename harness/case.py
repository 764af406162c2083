"""A Case: one concrete point of a sweep (op + parameters + dtype + seed), with a stable readable id."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnbench.dtypes import DTYPES, to_torch
from attnbench.ops import get_op
from attnbench.ops.base import Op, Params


@dataclass(frozen=True)
class Tolerance:
    """A suite's override of the tolerance rule; `why` is required and shown in the report."""

    factor: float | None = None  # multiple of the native-precision twin's error
    floor: float | None = None  # multiple of the dtype's unit roundoff
    why: str = ""


SIGNIFICANT_DIGITS = 6  # float parameters are kept to this many, so the id states them exactly and stays short


def _short(v: float) -> float:
    return float(f"{v:.{SIGNIFICANT_DIGITS}g}")


@dataclass(frozen=True)
class Case:
    """op + params + dtype + seed. `id` (e.g. `decode/b64-l4096-h32x8-d128-p16-bf16-swa128`) re-creates it.

    Float parameters are rounded to SIGNIFICANT_DIGITS on construction (an MLA `sm_scale` of
    0.1352337788608801 becomes 0.135234, id token `scale0.135234`): far below any kernel's precision,
    and the case built from the id is the same case, bit for bit.
    """

    op_name: str
    params: Params
    dtype: str = "bf16"
    seed: int = 0
    tolerance: Tolerance | None = field(default=None, compare=False)
    suite: str = field(default="", compare=False)
    device: str = field(default="cpu", compare=False)  # where inputs are built and kernels run
    require: frozenset[str] = field(default=frozenset(), compare=False)  # deterministic, batch_invariant
    invariance: bool = field(default=False, compare=False)  # check (and report) batch invariance
    count: int = field(default=1, compare=False)  # a replayed batch: how many times the server ran it
    trace: str = field(default="", compare=False)  # a replayed batch: its trace (a built-in name or a path)

    def __post_init__(self):
        floats = {k: _short(v) for k, v in self.params if isinstance(v, float) and _short(v) != v}
        if floats:
            object.__setattr__(self, "params", self.params.model_copy(update=floats))

    @property
    def op(self) -> Op:
        return get_op(self.op_name)

    @property
    def torch_dtype(self) -> torch.dtype:
        return to_torch(self.dtype)

    @property
    def id(self) -> str:
        tokens = self.op.id_tokens(self.params)
        tokens.append(self.dtype)
        if self.seed:
            tokens.append(f"s{self.seed}")
        return f"{self.op_name}/{'-'.join(tokens)}"

    @property
    def features(self) -> tuple[str, ...]:
        return self.op.features(self.params)

    @property
    def on_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    def make_inputs(self):
        return self.op.make_inputs(self.params, self.torch_dtype, self.seed, torch.device(self.device))

    @classmethod
    def from_id(cls, case_id: str, device: str = "cpu") -> Case:
        """Parse an id back into a case (parameters not in the id take their defaults). Only parses: an
        id naming explicit per-request lengths by digest (`lens3fa2c1d0`, a replayed batch) cannot be
        parsed (ValueError); `attnbench.plan.trace.case_from_id` looks those up in the traces."""
        op_name, _, rest = case_id.partition("/")
        op = get_op(op_name)
        dtype, seed, rest_tokens = "bf16", 0, []
        for t in filter(None, rest.split("-")):
            if t in DTYPES:
                dtype = t
            elif t[:1] == "s" and t[1:].isdigit():
                seed = int(t[1:])
            else:
                rest_tokens.append(t)
        params = op.Params(**op.parse_id_tokens(rest_tokens))
        return cls(op_name, params, dtype, seed, device=device)
