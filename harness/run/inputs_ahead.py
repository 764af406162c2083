"""The next case's inputs, built on the CPU on a background thread while this case runs its checks.

`Op.make_inputs` is `to_device(build_inputs(..., cpu), device)` (harness/ops/base.py): every value is
drawn and laid out on the CPU, then moved. The CPU half needs neither the device nor anything of the
case before it, so the runner hands the case its supervisor will send next (`RunJob.ahead`) to
`schedule` as soon as it has taken its own (`take`): the next case's `build_inputs` then runs beside
this case's reference and backends, and that case only moves the result to its device. The bits are
those `make_inputs` gives (the same function on the same arguments). The thread makes no CUDA call,
and the runner waits for it (`wait`) before a case's timing, so no build runs beside a timed window.

A check may add CPU work of its own from those inputs (`build_ahead(case, inputs, opts)`, an optional
method: the replay check builds batch B, a second full draw of the case's data); the runner hands the
result to the check's memo of that case (`"ahead"`).

Only ops that keep `Op.make_inputs` as it is are built ahead (an op that overrides it builds its own
way), and only inputs of at most `max_bytes()` (`Op.input_bytes`; 4 GiB, or a quarter of the host's
available memory where that is more): they sit in host memory until their case starts. On an H100's warm `ci` building inputs was 5.4 s of the 51 s sweep, 90% of it the
CPU half (a decode's 1 GiB paged cache: 1.0-1.4 s of draws and scatters, against ~0.1 s of copy).
Call `schedule`, `take` and `wait` from one thread. The bookkeeping (one thread, a build per case, those no
longer wanted forgotten, the wait) is `BackgroundWork` (store/background.py), shared with the reference cache's
reads ahead.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import torch

from attnbench.buffers import host_available_bytes
from attnbench.case import Case
from attnbench.store.background import BackgroundWork

AHEAD_MAX_BYTES = 4 * 2**30  # inputs built ahead, at most this large (they wait in host memory)...
AHEAD_HOST_SHARE = 0.25  # ...or at most this share of the host's available memory, where that is more


def max_bytes() -> int:
    """The largest inputs built ahead: `AHEAD_MAX_BYTES`, or `AHEAD_HOST_SHARE` of the host's MemAvailable
    where that is more. On an H200 host (128 GB) the targets suite's B128 L8192 decode (4.3 GB of paged
    cache) was over the fixed cap and built on the wall: 4.6 s of a 72.8 s warm run (h200-session23)."""
    host = host_available_bytes()
    return max(AHEAD_MAX_BYTES, int(AHEAD_HOST_SHARE * host)) if host is not None else AHEAD_MAX_BYTES


_builds = BackgroundWork("attnbench-inputs")  # `_key(case)` -> the build of its CPU inputs


def _key(case: Case) -> tuple:
    return case.op_name, json.dumps(case.params.model_dump(mode="json"), sort_keys=True), case.dtype, case.seed


def _buildable(case: Case) -> bool:
    from attnbench.ops.base import Op

    op = case.op
    if type(op).make_inputs is not Op.make_inputs:
        return False
    try:
        return op.input_bytes(case.params, case.torch_dtype, case.seed) <= max_bytes()
    except Exception:  # a plugin op that cannot size its inputs: built when its case runs
        return False


Extras = Callable[[Case], dict[str, Callable[[Any], Any]]]


def _build(case: Case, extras: dict[str, Callable[[Any], Any]]) -> tuple[Any, dict[str, Any]]:
    """The case's CPU inputs, and what each extra builds from them (None where one raised: its check
    then builds it itself, as without this module)."""
    x = case.op.build_inputs(case.params, case.torch_dtype, case.seed, torch.device("cpu"))
    out = {}
    for name, fn in extras.items():
        try:
            out[name] = fn(x)
        except Exception:
            out[name] = None
    return x, out


def schedule(cases: list[Case], extras: Extras | None = None) -> int:
    """Start building the CPU inputs of `cases` (not already under way) on the background thread, each
    followed by `extras(case)`: {name: fn(cpu inputs)}, more CPU work a check does from the inputs
    alone (the replay check's batch B: `Check.build_ahead`); builds of other cases not taken yet are
    forgotten. Returns how many builds this started."""
    keys = {_key(c): c for c in cases}
    _builds.keep_only(keys)  # one already running finishes, unused
    started = 0
    for k, c in keys.items():
        if k in _builds.keys() or not _buildable(c):
            continue
        if _builds.start(k, functools.partial(_build, c, extras(c) if extras else {})):
            started += 1
    return started


def take(case: Case) -> tuple[Any, dict[str, Any]] | None:
    """`(CPU inputs, {extra: its result})` built ahead for `case` (waited for, no longer held), or None:
    none were built, or the build failed (the case then builds them itself, and meets the error itself)."""
    try:
        return _builds.take(_key(case))
    except Exception:
        return None


def wait() -> float:
    """Wait until no build runs (the results stay held for `take`); returns the seconds waited."""
    return _builds.wait()


def pending() -> list[tuple]:
    """Keys of the builds not taken yet (tests)."""
    return _builds.keys()


def running() -> list[tuple]:
    """Keys of the builds not taken yet that have not finished (tests)."""
    return _builds.running()
