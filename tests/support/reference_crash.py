"""A plugin for tests of crash attribution: a worker that loads it dies (`os._exit(9)`) while it builds the
inputs and references of any case whose id contains CRASH_MARK, before any backend code of the case runs.
It wraps `attnbench.run.runner._build`, the step of a case the supervisor knows as the stage "reference"."""

from __future__ import annotations

import os

from attnbench.run import runner

CRASH_MARK = "t9-"
_build = runner._build


def _crashing_build(case, *args, **kwargs):
    if CRASH_MARK in case.id:
        os._exit(9)
    return _build(case, *args, **kwargs)


runner._build = _crashing_build
