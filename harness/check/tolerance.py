"""The tolerance rule: how far from float64 a correct kernel may be.

A numeric output passes when

    max |out - ref|  <=  factor * max |twin - ref|  +  floor * (u(dtype) + sqrt(n) * u(fp32)) * scale

- `ref` is the float64 reference, `twin` the native-precision twin (the same math in the case dtype
  with float32 accumulation, probabilities rounded like a flash kernel; references/),
- `factor` (default 2; FlashAttention's own tests use 2) allows a different but faithful rounding
  order, `u(dtype)` is the unit roundoff of the output's dtype (fp32 2^-24, fp16 2^-11, bf16 2^-8),
- `scale` is max |ref| over finite elements (1 when that is 0), and `floor` (default 1) catches the
  case where the twin happens to be exact: one unit of the output's roundoff, plus the float32
  rounding of the dot products of length n the output is computed through (OutputSpec.floor_units:
  for attention outputs head_dim + keys: the head_dim-long score dot products and the keys-long P.V
  and denominator sums), which grows like sqrt(n). Two faithful float32 computations that
  sum in different orders differ by that much, and the twin's own error is one random sample of it;
  for bf16/fp16 outputs the first term dominates.

An output computed as a weighted sum whose terms can cancel (attention's P.V, merge_state) declares
a `magnitude` (OutputSpec): the float64 reference's first-order size of its float32 rounding (the
summands sum w|v|, and the score rounding that exp amplifies); the float32 part of the floor then
follows it, `(1 + sqrt(n)) * u(fp32) * magnitude`, while the output's own rounding stays
`u(dtype) * scale`.

The rule is applied per (request, head) slice of each output (harness/check/checks.py `compare_numeric`):
the twin's error and `scale` are taken over the slice (the floor doubled to one ulp: a slice's twin
error is a small sample), capped by the per-tensor bound.

Non-finite expectations (-inf LSE of an empty row) must be matched exactly. A suite may override
`factor` and `floor` per sweep entry, only with a written `why` that the console, summary.md and the
report's first screen show, with finite values, and at most MAX_FACTOR (16, 8x the default) and
MAX_FLOOR (16 units, 16x the default): a faithful kernel that sums in another order lands within a
few times the twin's error (the worst seen, fp32 over 300 keys before the keys term existed, 4x),
while a real bug (a wrong scale, a dropped key, a stale page) is off by a sizeable fraction of |ref|,
hundreds of bf16 ulps; 16 leaves room for a library's known rounding and still catches those. Beyond
it a case belongs in an expectation (a known failure with its reason), not in a looser rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.dtypes import unit_roundoff

DEFAULT_FACTOR = 2.0
DEFAULT_FLOOR = 1.0
MAX_FACTOR = 16.0  # the most a suite may loosen `factor` to (see above)
MAX_FLOOR = 16.0  # the most a suite may loosen `floor` to


@dataclass(frozen=True)
class Rule:
    factor: float = DEFAULT_FACTOR
    floor: float = DEFAULT_FLOOR
    why: str = ""

    def floor_abs(self, dtype: torch.dtype, scale, sqrt_n: float = 0.0, magnitude=None, ulps: float = 1.0):
        """`ulps * floor * (u(dtype) + sqrt_n * u(fp32)) * scale`; with `magnitude` (the size of the
        summands, OutputSpec.magnitude) the float32 part follows it instead: `ulps * floor * (u(dtype) *
        scale + (1 + sqrt_n) * u(fp32) * magnitude)`. Floats or tensors (per slice)."""
        u, u32 = unit_roundoff(dtype), unit_roundoff(torch.float32)
        if magnitude is None:
            return ulps * self.floor * (u + sqrt_n * u32) * scale
        return ulps * self.floor * (u * scale + (1 + sqrt_n) * u32 * magnitude)

    def bound(self, native_err, dtype: torch.dtype, scale, sqrt_n: float = 0.0, magnitude=None, ulps: float = 1.0):
        return self.factor * native_err + self.floor_abs(dtype, scale, sqrt_n, magnitude, ulps)

    def describe(
        self,
        native_err: float,
        dtype: torch.dtype,
        scale: float,
        sqrt_n: float = 0.0,
        magnitude=None,
        ulps: float = 1.0,
    ) -> str:
        floor = self.floor_abs(dtype, scale, sqrt_n, magnitude, ulps)
        return f"{self.factor:g}x twin {native_err:.2e} + floor {floor:.2e} = {self.factor * native_err + floor:.2e}"


def rule_for(case) -> Rule:
    t = case.tolerance
    if t is None:
        return Rule()
    return Rule(
        factor=DEFAULT_FACTOR if t.factor is None else t.factor,
        floor=DEFAULT_FLOOR if t.floor is None else t.floor,
        why=t.why,
    )
