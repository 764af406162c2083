"""tools/install-deployed.sh: pinned --no-deps lists that never touch torch, and clear refusals."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from attnbench.kernels.sglang import _lib

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tools" / "install-deployed.sh"
LISTS = ROOT / "tools" / "deployed"


def _pins(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_every_list_pins_exact_versions_and_leaves_torch_alone():
    for path in LISTS.glob("*.txt"):
        pins = _pins(path)
        assert pins, path
        for pin in pins:
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+", pin), f"{path.name}: {pin!r} is not name==version"
            name = pin.split("==")[0].lower()
            assert name not in ("torch", "triton", "torchvision", "numpy"), f"{path.name} must not replace {name}"


def test_sglang_list_pins_the_version_the_adapter_is_written_for():
    assert f"sglang=={_lib.PINNED}" in _pins(LISTS / "sglang.txt")


def test_vllm_list_pins_the_version_the_adapter_is_written_for():
    from attnbench.kernels.vllm import _lib as vllm_lib

    assert f"vllm=={vllm_lib.PINNED}" in _pins(LISTS / "vllm.txt")


def test_unknown_library_is_refused_with_the_known_ones():
    r = subprocess.run(["bash", str(SCRIPT), "nope"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "no pinned list for 'nope'" in r.stderr and "sglang" in r.stderr


def test_no_argument_is_a_usage_error():
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage" in r.stderr
