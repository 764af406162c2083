"""User plugins: the example plugin passes the smoke decode cases it supports, by file and by entry point."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

from typer.testing import CliRunner

from attnbench import backend
from attnbench.cli.app import app
from attnbench.store.results import read_results

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sdpa_backend.py"


def test_example_plugin_by_file_passes_or_skips_with_reasons(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["sweep", "smoke", "--op", "decode", "--plugin", str(EXAMPLE), "--backend", "sdpa",
                                   "--out", str(out), "--device", "cpu", "--no-timing"], catch_exceptions=False)  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = read_results(out / "results.jsonl")
    assert {r.status for r in rows} == {"pass", "skip"}
    assert sum(r.status == "pass" for r in rows) >= 6  # smoke is generated: at least its six plain seed cases
    assert all("sdpa example" in r.reason for r in rows if r.status == "skip")


def test_entry_point_group_loads_plugins(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    ep = importlib.metadata.EntryPoint(name="sdpa", value="sdpa_backend", group="attnbench.backends")
    broken = importlib.metadata.EntryPoint(name="broken", value="no_such_plugin_module", group="attnbench.backends")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [ep, broken] if group else [])
    sys.modules.pop("sdpa_backend", None)
    backend.load_entry_points()
    assert "sdpa" in backend.all_backends()
    assert any("broken" in p and "no_such_plugin_module" in p for p in backend.LOAD_PROBLEMS)
