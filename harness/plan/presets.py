"""Where the built-in suites live, and the model presets beside them (suites/models/presets.yaml).

Read by the suite loader (attnbench.plan.suite) and by the traces (attnbench.plan.trace), which a suite loads:
kept apart from both so that neither imports the other to find them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml


def suites_dir() -> Path:
    """The folder of the built-in suites (the package attnbench.suites)."""
    return Path(str(resources.files("attnbench.suites")))


def presets() -> dict[str, dict[str, dict[str, Any]]]:
    """Model presets: model -> preset key (op family) -> parameter values."""
    return yaml.safe_load((suites_dir() / "models" / "presets.yaml").read_text(encoding="utf-8"))
