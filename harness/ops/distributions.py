"""Input distributions beyond randn (the suite axis `distribution`), seeded and documented.

| name | what it stresses | how the data is drawn |
|---|---|---|
| `normal` | the default | N(0, 1) everywhere |
| `outliers` | LLM activation outliers: a few channels 50-100x larger | N(0, 1); 4 channels of q, k and v (chosen per case) scaled by 50-100 |
| `peaked` | one key dominates every query: exp underflow, LSE accuracy | q gets a component of 30 along a shared unit direction u, each request's first key is 30·u, so its score leads by about 80 (head_dim 128) |
| `large_logits` | raw scores in the hundreds: the max subtraction | q and k are N(0, 9): q·k has a standard deviation of 9·sqrt(D) (about 100 at D = 128) |
| `flat` | all keys equal: a uniform softmax over long sequences | every key of a request and kv head is the same vector |
| `long_tail` | heavy tails | log-normal magnitudes exp(N(0, 1)) with random signs |

Structure (peaked, flat) is applied per request by the op that knows the positions; this module
draws the element values.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from attnbench.ops import rng

Distribution = Literal["normal", "outliers", "peaked", "large_logits", "flat", "long_tail"]
DISTRIBUTIONS: tuple[str, ...] = get_args(Distribution)

GROUP_ELEMENTS = 1 << 28  # float32 values drawn on the host at once by `draw_many` (1 GiB)
PEAK = 30.0  # |q| component along u and |k_0|: score lead = PEAK^2 * sm_scale (80 at D = 128)


class Sampler:
    """Draws q/k/v-like tensors for one case: `draw(role, shape)`, role in {q, k, v}, last dim = channels."""

    def __init__(self, kind: str, gen: torch.Generator, device, dtype):
        if kind not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {kind!r}; expected one of {', '.join(DISTRIBUTIONS)}")
        self.kind, self.gen, self.device, self.dtype = kind, gen, device, dtype
        self._channels: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._u: dict[int, torch.Tensor] = {}

    def _randn(self, shape) -> torch.Tensor:
        return rng.randn(shape, self.gen).to(self.device)

    def direction(self, dim: int) -> torch.Tensor:
        """The shared unit direction of `peaked` for vectors of `dim` channels."""
        if dim not in self._u:
            u = self._randn((dim,))
            self._u[dim] = u / u.norm()
        return self._u[dim]

    def _outlier_channels(self, role: str, dim: int):
        key = (role, dim)
        if key not in self._channels:
            n = min(4, dim)
            idx = torch.randperm(dim, generator=self.gen, device=self.device)[:n]
            scale = 50 + 50 * torch.rand(n, generator=self.gen, device=self.device)
            self._channels[key] = (idx, scale)
        return self._channels[key]

    def draw(self, role: str, shape) -> torch.Tensor:
        """Values in float32 (the caller casts or quantises)."""
        return self._shaped(role, shape, self._randn(shape))

    def draw_many(self, role: str, shapes) -> list[torch.Tensor]:
        """`[draw(role, s) for s in shapes]`, the same bits, drawn `GROUP_ELEMENTS` at a time in parallel
        (`rng.randn_many`). After the first draw every kind but `long_tail` takes exactly one value from
        the generator per draw (the outlier channels and the peaked direction are drawn once per
        channel count, by the first), so the later draws can take theirs up front."""
        shapes = [tuple(s) for s in shapes]
        if self.kind == "long_tail" or len(shapes) < 2 or len({s[-1] for s in shapes}) > 1:
            return [self.draw(role, s) for s in shapes]
        out = [self.draw(role, shapes[0])]
        rest = shapes[1:]
        while rest:
            n, size = 0, 0
            while n < len(rest) and (n == 0 or size + math.prod(rest[n]) <= GROUP_ELEMENTS):
                size += math.prod(rest[n])
                n += 1
            group, rest = rest[:n], rest[n:]
            out += [self._shaped(role, s, x.to(self.device)) for s, x in zip(group, rng.randn_many(group, self.gen))]
        return out

    def _shaped(self, role: str, shape, x: torch.Tensor) -> torch.Tensor:
        """Standard-normal draws `x` of `shape` on the device -> the distribution's values (draw's second half)."""
        if self.kind == "outliers":
            idx, scale = self._outlier_channels(role, shape[-1])
            x[..., idx] *= scale
        elif self.kind == "large_logits" and role in ("q", "k"):
            x *= 3.0
        elif self.kind == "long_tail":
            mag = torch.exp(self._randn(shape))
            x = torch.sign(x) * mag
        elif self.kind == "peaked" and role == "q":
            x = x + PEAK * self.direction(shape[-1])
        return x

    def structure_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """One request's keys `[L, H, D]` (float32) shaped by the distribution: `flat`, `peaked` first key."""
        if self.kind == "flat" and keys.shape[0]:
            keys = keys[:1].expand_as(keys).clone()
        elif self.kind == "peaked" and keys.shape[0]:
            keys = keys.clone()
            keys[0] = PEAK * self.direction(keys.shape[-1])
        return keys


def lse_like(kind: str, shape, gen: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partial-state LSEs for merge_state: large (hundreds), one side dominating, or equal."""
    a = rng.randn(shape, gen, 4.0).to(device)
    b = rng.randn(shape, gen, 4.0).to(device)
    if kind == "large_logits":
        a, b = a * 50, b * 50
    elif kind == "peaked":
        b = a - 80.0 * torch.sign(rng.randn(shape, gen).to(device))
    elif kind == "flat":
        b = a.clone()
    return a, b
