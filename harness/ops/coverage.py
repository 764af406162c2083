"""Pairwise (all-pairs) coverage of every op's parameter space: how the `smoke` suite is built.

Real kernel bugs live where two features meet (a window with a prefix, sinks on empty rows, fp8 scales
with GQA), so `smoke` is generated, not hand-listed: for each op, every pair of values of two axes
that the op's contract allows appears in at least one case.

Axes come from the op's parameter model: every `Literal` and `bool` field is an axis over all its
values by construction; other fields take the values listed in `SPACE` (numeric edges included:
decode lengths in the thousands, a non-default scale); a few fields are tied into one compound axis
(`heads_q,heads_kv`) because only some tuples are meaningful; the case dtype is an axis too. A field
that is neither an axis nor `HELD` (with the reason) is an error, so a new parameter cannot be left
out. A pair the contract forbids (the op's validation rejects every case holding it, e.g. `empty_rows`
without a custom mask) is never silently dropped: it is listed as forbidden with the validator's
message (`attnbench list ops --coverage`, or `python -m attnbench.ops.coverage`).

The generator is greedy (AETG-like) and deterministic: each new case starts from the first uncovered
pair and fills the other axes with the value that covers the most uncovered pairs, repaired until
the op's validation accepts it. `python -m attnbench.ops.coverage --write` rewrites suites/smoke.yaml;
a test keeps the committed file equal to the generator's output.
"""

from __future__ import annotations

import functools
import itertools
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from pydantic import ValidationError

from attnbench.ops import OPS

Value = Any
_ATTN = {
    # (12, 4): a group of 3 with several kv heads, so a kernel that pads the group to a power of two
    # and strides by the padded size reads the wrong heads (one kv head would hide it)
    "heads_q,heads_kv": [(4, 4), (8, 2), (8, 1), (16, 1), (12, 4)],
    "head_dim,head_dim_v": [(64, None), (13, None), (96, 64), (576, 512)],
    "page_size": [1, 16, 64],
    "window": [-1, 6, 90],
    "soft_cap": [0.0, 5.0],
    "sm_scale": [None, 0.09],
    "dtype": ["bf16", "fp16", "fp32"],
}
_GDN = {
    "heads_qk,heads_v": [(2, 2), (1, 4), (2, 6)],
    # (128, 128), the production shape: K and V wider than a 64-wide tile (per-tile norms, tiled states)
    "head_dim_k,head_dim_v": [(16, 16), (32, 16), (16, 48), (128, 128)],
    "scale": [None, 0.4],
    "dtype": ["bf16", "fp16", "fp32"],
}
_TREE = {"tree,depth,topk,draft_tokens": [("chain", 4, None, None), ("binary", 2, None, None),
                                          ("typical", 3, 4, None), ("0_1_0.0_0.1_1.0", 2, None, None),
                                          ("eagle", 3, 2, 6), ("eagle", 5, 4, 32), ("chain", 0, None, None)]}  # fmt: skip

# Values of the fields that are not Literal/bool (those are axes over all their values automatically).
# Batches of variable-length requests reach 5: with 3 or fewer, every request is the first, the second
# (whose offset is request 0's length) or the last (whose offset is total minus its own length), so a
# kernel that derives offsets from request 0 or from the end lands on the right rows by accident.
SPACE: dict[str, dict[str, list[Value]]] = {
    # draft decode (draft_topk > 1): (topk, own draft tokens) tied, since a step without candidates is refused;
    # kv_len - step leaves a partial last prefix page at every page size > 1 (the per-candidate copies)
    # kv_len 1024: a multiple of every power-of-two split size (a last split computed as L % split vanishes)
    "decode": _ATTN | {"batch": [2, 5], "kv_len": [1, 45, 300, 1024, 4000],
                       "draft_topk,draft_step": [(1, 1), (4, 1), (2, 3)]},
    # q_len 130: a causal query tile of 64 or 128 rows filled, and one more partial one
    "extend": _ATTN | {"batch": [2, 5], "q_len": [1, 7, 24, 130], "prefix_len": [0, 21, 120]},
    "tree_verify": _ATTN | {
        "heads_q,heads_kv": [(8, 2), (16, 1)], "head_dim,head_dim_v": [(64, None), (576, 512)],
        "tree,depth,topk,draft_tokens": [("chain", 4, None, None), ("0_1_0.0_0.1_1.0", 2, None, None),
                                         ("eagle", 3, 2, 6), ("chain", 0, None, None)],
        "batch": [2, 5], "prefix_len": [1, 21, 100], "window": [-1], "page_size": [1, 16]},
    "merge_state": {"tokens": [17, 33], "heads": [2, 4], "head_dim": [32, 64], "dtype": ["bf16", "fp16", "fp32"]},
    "eagle_build_tree": {"batch": [1, 3], "prefix_len": [1, 40],
                         "topk,depth,draft_tokens": [(1, 5, 6), (2, 3, 6), (4, 4, 16), (8, 2, 8)]},
    "verify_greedy": _TREE | {"batch": [1, 4], "accept": [0.0, 0.7, 1.0]},
    "gdn_gating": {"tokens": [1, 33, 300], "heads_v": [4, 6], "dtype": ["bf16", "fp16", "fp32"]},
    # dim 130: channels over more than one 64- or 128-wide tile (per-tile bias and weight offsets)
    "causal_conv1d": {"batch": [1, 3, 5], "seq_len": [1, 2, 3, 9, 40], "dim": [40, 48, 130],
                      "width": [2, 3, 4], "pad": [0, 1], "dtype": ["bf16", "fp16", "fp32"]},
    "gdn_decode": _GDN | {"batch": [3, 6], "pad": [0, 1, 2]},
    # seq_len 300: five 64-token chunks, past a 256-token split (state carried and decayed across it)
    "gdn_extend": _GDN | {"batch": [1, 5], "seq_len": [1, 3, 64, 150, 300]},
    "gdn_verify": _GDN | {"batch": [2, 5], "draft": [1, 3, 8], "pad": [0, 1]},
    # chains of torch steps (smoke runs on a CPU): every op after a pool-writing one, a decode after a commit
    # (steps as ChainParams spells them: the pairs are compared with the cases' values)
    "gdn_chain": {"steps": ["gdn_extend@torch > gdn_decode@torch > gdn_verify@torch > gdn_commit@torch > gdn_decode@torch",
                            "gdn_decode@torch > gdn_extend@torch > gdn_verify@torch > gdn_decode@torch"],
                  "heads_qk,heads_v": [(2, 2), (1, 4)], "head_dim_k,head_dim_v": [(16, 16), (32, 16)],
                  "batch": [3, 5], "seq_len": [9, 70], "draft": [1, 3], "pad": [0, 1], "dtype": ["bf16", "fp32"]},
    "gdn_commit": {"batch": [1, 3, 5], "draft": [1, 3, 8], "heads_v": [2, 3],
                   "head_dim_k,head_dim_v": [(16, 16), (32, 16)], "dim": [40, 48, 130], "width": [2, 3, 4],
                   "pad": [0, 1], "dtype": ["bf16", "fp16", "fp32"]},
}  # fmt: skip

# Fields held at one value in smoke, with the reason (anything else must be an axis).
_REPLAYED = "explicit per-request lengths come from replayed traces (tests/harness/test_trace.py), not from pairs"
_LARGE = "production-size pools past 2^31 elements (int32 offsets) are suites/large.yaml's, on a GPU"
_POOL = {"pool_pages": (None, _LARGE)}
_SLOTS = {"state_slots": (None, _LARGE)}
HELD: dict[str, dict[str, tuple[Value, str]]] = {
    "decode": {"kv_lens": (None, _REPLAYED)} | _POOL,
    "extend": {"q_lens": (None, _REPLAYED), "prefix_lens": (None, _REPLAYED)} | _POOL,
    "tree_verify": _POOL,
    "gdn_decode": _SLOTS,
    "gdn_extend": _SLOTS,
    "gdn_verify": _SLOTS,
    "gdn_chain": {
        "handoff": (
            "convert",
            "raw hands a step memory in a layout its backend does not declare: a designed "
            "failure of torch's steps on a vk pool (tests/kernels/test_gdn_chain.py)",
        )
    },
}

# Cases every plan starts from (their pairs count as covered): ids that other tests and CI gates name
# stay in smoke. Axes they leave out take their first value.
SEEDS: dict[str, list[dict[str, Value]]] = {
    "decode": [
        *(
            {"batch": 2, "kv_len": 45, "heads_q,heads_kv": (4, 2), "head_dim,head_dim_v": (dim, None), "page_size": 16}
            for dim in (13, 64, 80, 96, 128, 256)
        ),
        # Long dense sums in 16-bit: thousands of visible keys (no window), diffuse scores (normal), a
        # 16-bit cache and output. Low-precision accumulation shows only where all of these meet, which
        # pairwise coverage does not promise (it may pair the long length with a window or fp8 only).
        *(
            {"batch": 5, "kv_len": 4000, "lens": "mixed", "heads_q,heads_kv": (8, 2), "page_size": 16, "dtype": dt}
            for dt in ("bf16", "fp16")
        ),
        # Sinks over a long dense row: a split-KV kernel must add the sink once, to the merged state, output
        # included; the sink's share of the mass is visible in fp32 over 1024 keys. Every request holds
        # exactly 1024 keys, a multiple of every power-of-two split size.
        {"batch": 2, "kv_len": 1024, "heads_q,heads_kv": (8, 2), "page_size": 16, "sinks": True, "dtype": "fp32"},
    ],
    "merge_state": [
        {"tokens": 33, "heads": 4, "head_dim": 64, "dtype": "fp32"},
        {"tokens": 33, "heads": 4, "head_dim": 64, "dtype": "bf16"},
        {"tokens": 17, "heads": 2, "head_dim": 32, "distribution": "peaked", "dtype": "bf16"},
    ],
    # update mode fixes five axes (seq_len 1, lens, init, tree, pad): the greedy fill and its random
    # repairs miss completions of (batch, update) and (width, update), which would be listed as forbidden
    # though allowed; one update case per batch and width
    "causal_conv1d": [
        {"batch": b, "mode": "update", "width": w, "dim": c, "dtype": dt}
        for b, w, c, dt in ((1, 2, 40, "bf16"), (3, 3, 48, "fp16"), (5, 4, 40, "fp32"))
    ],
}

# Case ids that CI expectations (suites/expectations/findings.yaml) name: kept in smoke as seeds.
SEED_IDS: list[str] = [
    *(
        f"decode/b3-l{n}-mixed-h{h}-d128-p{p}-bf16"
        for n in (37, 80)
        for h in ("4x4", "8x1", "8x2")
        for p in (1, 16, 64)
    ),
    "decode/b3-l70-skewed-h8x2-d64-p16-cap5-bf16",
    "decode/b3-l70-skewed-h8x2-d64-p16-swa7-cap5-sink-bf16",
    "extend/b2-q8-pre30-h8x2-d64-p1-cap5-bf16",
    "extend/b2-q8-pre30-h8x2-d64-p1-swa5-cap5-sink-bf16",
    "gdn_extend/b2-t70-h1x2-d32x16-fp32",
    "gdn_extend/b2-t70-h1x2-d32x16-initnone-fp32",
    "gdn_decode/b5-h2x4-d16x16-packed-bf16",
]


def _seed_from_id(case_id: str, axes: list[Axis]) -> dict[str, Value]:
    from attnbench.case import Case

    case = Case.from_id(case_id)
    values = case.params.model_dump() | {"dtype": case.dtype}
    return {ax.name: tuple(values[f] for f in ax.fields) if len(ax.fields) > 1 else values[ax.name] for ax in axes}


# Pairs the contract allows but smoke leaves out, each with the reason (an open finding, never silent):
# no smoke case holds them, and `describe` lists them apart from the forbidden ones.
EXCLUDED: dict[str, dict[tuple, str]] = {}

CASE_LIMIT = 400
RANDOM_TRIES = 400  # seeded random completions tried when the greedy one is invalid  # a generator that needs more cases than this for one op has a bug


@dataclass
class Axis:
    name: str  # field name, or "a,b" for a compound axis, or "dtype"
    values: list[Value]

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.name.split(","))

    def assign(self, value: Value) -> dict[str, Value]:
        vals = value if len(self.fields) > 1 else (value,)
        return dict(zip(self.fields, vals))


@dataclass
class Coverage:
    """One op's pairwise plan: its axes, the generated cases, and the forbidden pairs with the reason."""

    op: str
    axes: list[Axis]
    cases: list[dict[str, Value]] = field(default_factory=list)  # axis name -> value
    forbidden: dict[tuple, str] = field(default_factory=dict)  # ((axis, value), (axis, value)) -> why

    def pairs(self) -> list[tuple]:
        out = []
        for a, b in itertools.combinations(range(len(self.axes)), 2):
            for va in self.axes[a].values:
                for vb in self.axes[b].values:
                    out.append(((self.axes[a].name, _key(va)), (self.axes[b].name, _key(vb))))
        return out

    def covered(self) -> set[tuple]:
        got = set()
        for c in self.cases:
            items = [(ax.name, _key(c[ax.name])) for ax in self.axes]
            got.update(itertools.combinations(items, 2))
        return got


def _key(v: Value) -> Value:
    return tuple(v) if isinstance(v, list) else v


def axes_for(op_name: str) -> list[Axis]:
    """The axes of an op: Literal/bool fields automatically, the rest from SPACE; every field accounted for."""
    op = OPS[op_name]
    space, held = SPACE.get(op_name, {}), HELD.get(op_name, {})
    hints = get_type_hints(op.Params)
    in_space = {f for name in space for f in name.split(",")}
    axes = [Axis(name, list(vals)) for name, vals in space.items() if vals and len(vals) >= 1]
    for name in op.Params.model_fields:
        if name in in_space or name in held:
            continue
        ann = hints[name]
        if ann is bool:
            axes.append(Axis(name, [False, True]))
        elif get_origin(ann) is Literal:
            axes.append(Axis(name, list(get_args(ann))))
        else:
            raise KeyError(
                f"{op_name}.{name}: not an axis of the smoke coverage; give it values in "
                "attnbench.ops.coverage.SPACE (or hold it in HELD with a reason)"
            )
    return axes


def _excluded(op_name: str, values: dict[str, Value]) -> str | None:
    for ((a, va), (b, vb)), why in EXCLUDED.get(op_name, {}).items():
        if a in values and b in values and _key(values[a]) == va and _key(values[b]) == vb:
            return f"excluded from smoke: {why}"
    return None


def _valid(op_name: str, values: dict[str, Value]) -> str | None:
    """None when the op's parameter model accepts the case (and it holds no EXCLUDED pair), else why not."""
    if why := _excluded(op_name, values):
        return why
    params = {k: v for a, v in values.items() if a != "dtype" for k, v in _split(a, v).items()}
    try:
        OPS[op_name].Params(**params)
    except ValidationError as e:
        return e.errors()[0]["msg"].removeprefix("Value error, ")
    return None


def _split(axis: str, value: Value) -> dict[str, Value]:
    names = axis.split(",")
    return dict(zip(names, value if len(names) > 1 else (value,)))


@functools.cache
def generate(op_name: str) -> Coverage:
    """The greedy all-pairs plan of one op (deterministic; computed once per process)."""
    axes = axes_for(op_name)
    cov = Coverage(op_name, axes)
    uncovered = dict.fromkeys(cov.pairs())  # ordered set
    for seed in SEEDS.get(op_name, []) + [_seed_from_id(i, axes) for i in SEED_IDS if i.startswith(op_name + "/")]:
        case = {ax.name: seed.get(ax.name, ax.values[0]) for ax in axes}
        if why := _valid(op_name, case):
            raise ValueError(f"{op_name}: seed case {seed} is invalid: {why}")
        cov.cases.append(case)
        for pair in itertools.combinations([(ax.name, _key(case[ax.name])) for ax in axes], 2):
            uncovered.pop(pair, None)
    while uncovered:
        seed_pair = next(iter(uncovered))
        case = _complete(op_name, axes, seed_pair, uncovered)
        if case is None:
            cov.forbidden[seed_pair] = _why_forbidden(op_name, axes, seed_pair)
            del uncovered[seed_pair]
            continue
        cov.cases.append(case)
        items = [(ax.name, _key(case[ax.name])) for ax in axes]
        for pair in itertools.combinations(items, 2):
            uncovered.pop(pair, None)
        if len(cov.cases) > CASE_LIMIT:
            raise RuntimeError(f"{op_name}: pairwise generation exceeded {CASE_LIMIT} cases")
    return cov


def _gain(axes, partial: dict, name: str, value: Value, uncovered) -> int:
    order = [ax.name for ax in axes]
    n = 0
    for other, ov in partial.items():
        a, b = (other, _key(ov)), (name, _key(value))
        pair = (a, b) if order.index(other) < order.index(name) else (b, a)
        n += pair in uncovered
    return n


def _complete(op_name: str, axes: list[Axis], seed_pair, uncovered) -> dict | None:
    """A valid case holding `seed_pair`: the greedy completion, else the best of seeded random ones.

    Returns None when no valid completion is found (the pair is then reported as forbidden).
    """
    (a, va), (b, vb) = seed_pair
    by = {ax.name: ax for ax in axes}
    fixed = {a: _value(by[a], va), b: _value(by[b], vb)}
    rest = [ax for ax in axes if ax.name not in fixed]
    partial = dict(fixed)
    for ax in rest:
        partial[ax.name] = max(ax.values, key=lambda v: _gain(axes, partial, ax.name, v, uncovered))
    if _valid(op_name, partial) is None:
        return {ax.name: partial[ax.name] for ax in axes}
    rnd = random.Random(repr(seed_pair))
    best, best_gain = None, -1
    for _ in range(RANDOM_TRIES):
        trial = dict(partial)
        for ax in rnd.sample(rest, k=rnd.randint(1, len(rest))) if rest else ():
            trial[ax.name] = rnd.choice(ax.values)
        if _valid(op_name, trial) is None:
            gain = _case_gain(axes, trial, uncovered)
            if gain > best_gain:
                best, best_gain = trial, gain
    return None if best is None else {ax.name: best[ax.name] for ax in axes}


def _case_gain(axes, case: dict, uncovered) -> int:
    items = [(ax.name, _key(case[ax.name])) for ax in axes]
    return sum(pair in uncovered for pair in itertools.combinations(items, 2))


def _value(ax: Axis, key: Value) -> Value:
    return next(v for v in ax.values if _key(v) == key)


def _why_forbidden(op_name: str, axes, pair) -> str:
    (a, va), (b, vb) = pair
    by = {ax.name: ax for ax in axes}
    base = {ax.name: ax.values[0] for ax in axes} | {a: _value(by[a], va), b: _value(by[b], vb)}
    return _valid(op_name, base) or "no valid completion found"


# ---- the smoke suite ------------------------------------------------------------------------------
def smoke_path() -> Path:
    from attnbench import suites

    return Path(suites.__file__).resolve().parent / "smoke.yaml"


_HEADER = """\
# GENERATED by `python -m attnbench.ops.coverage --write` from each op's parameter space: every pair
# of values of two axes that an op allows appears in at least one case (all-pairs coverage). Do not
# edit by hand: change attnbench/ops/coverage.py (SPACE, HELD) or the op's parameters, and rewrite.
name: smoke
description: >
  Pairwise coverage of every op's parameters and features on small shapes (numeric edges included:
  decode over 4000 keys, logits that overflow an unstabilised softmax, GDN gates beyond exp overflow).
  Runs on a CPU in under a minute with the torch backend; on a GPU a fast correctness pass.
device: any
cases:
"""


def _yaml_value(v: Value) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"' if not v.replace("_", "").isalnum() or v in ("true", "false", "null") else v
    return repr(v)


def smoke_yaml() -> str:
    lines = [_HEADER]
    for op_name in OPS:
        cov = generate(op_name)
        lines.append(f"  # {op_name}: {len(cov.cases)} cases cover {len(cov.covered() & set(cov.pairs()))} pairs"
                     f" ({len(cov.forbidden)} forbidden)\n")  # fmt: skip
        for c in cov.cases:
            params = {k: v for a, val in c.items() if a != "dtype" for k, v in _split(a, val).items()}
            params = {k: v for k, v in params.items() if v is not None}
            body = ", ".join(f"{k}: {_yaml_value(v)}" for k, v in params.items())
            lines.append(f"  - op: {op_name}\n    params: {{{body}}}\n    dtypes: [{c.get('dtype', 'bf16')}]\n")
    return "".join(lines)


def describe(op_name: str) -> str:
    """Human-readable coverage of one op: axes, cases, pairs covered, forbidden pairs with reasons."""
    cov = generate(op_name)
    pairs = set(cov.pairs())
    got = cov.covered() & pairs
    out = [f"{op_name}: {len(cov.cases)} cases, {len(got)}/{len(pairs) - len(cov.forbidden)} allowed pairs covered"]
    out += [f"  axis {ax.name}: {', '.join(map(str, ax.values))}" for ax in cov.axes]
    for (a, b), why in cov.forbidden.items():
        kind = "excluded" if why.startswith("excluded from smoke") else "forbidden"
        out.append(f"  {kind} {a[0]}={a[1]} with {b[0]}={b[1]}: {why.removeprefix('excluded from smoke: ')}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"]:
        smoke_path().write_text(smoke_yaml())
        print(f"wrote {smoke_path()}")
        return 0
    for name in argv or list(OPS):
        print(describe(name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
