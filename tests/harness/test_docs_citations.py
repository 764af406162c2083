"""Every document a source file or a doc cites by name exists in the repository (nine files once cited an
ARCHITECTURE.md that was never committed)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cited_docs_exist():
    cited = re.compile(r"(?<![\w/.-])(docs/[\w-]+\.md|[A-Z][A-Z_]+\.md)\b")  # a doc, or an all-caps NAME.md
    missing = []
    for folder in ("harness", "kernels", "references", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in (".py", ".md") or not path.is_file():
                continue
            for name in cited.findall(path.read_text(encoding="utf-8")):
                if not ((ROOT / name).exists() or (path.parent / name).exists() or (ROOT / "docs" / name).exists()):
                    missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing
