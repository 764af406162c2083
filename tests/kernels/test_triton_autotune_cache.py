"""Loading the built-in backends lets Triton keep its autotune choices on disk (kernels/__init__.py),
unless the environment says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = "import os, attnbench.kernels; print(os.environ.get('TRITON_CACHE_AUTOTUNING'))"


@pytest.mark.parametrize(("given", "seen"), [(None, "1"), ("0", "0"), ("1", "1")])
def test_autotune_choices_are_cached_unless_the_user_says_otherwise(given, seen):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_AUTOTUNING"}
    if given is not None:
        env["TRITON_CACHE_AUTOTUNING"] = given
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == seen


def test_triton_reads_it_when_autotuners_are_made():
    triton = pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_AUTOTUNING", "TRITON_INTERPRET")}
    code = (
        "import attnbench.kernels, triton\n"
        "from attnbench.kernels.triton import gdn_chunk\n"
        "print(triton.knobs.autotuning.cache, gdn_chunk._chunk_state_kernel.cache_results)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"], (triton.__version__, out.stdout)
