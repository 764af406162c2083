"""docs/findings.md cites the built-in expectations by backend and case, never by line number (line numbers
of suites/expectations/findings.yaml move with every entry added above them), and every backend/case it
cites is an entry there."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "findings.md"
EXPECT = ROOT / "suites" / "expectations" / "findings.yaml"


def test_no_line_numbers_into_the_expectations():
    stale = re.findall(r"findings\.yaml:\d+", DOC.read_text())
    assert not stale, f"cite the entry by backend and case instead: {stale}"


def test_cited_entries_exist():
    entries = yaml.safe_load(EXPECT.read_text())["expect"]
    cited = re.findall(r"`([\w-]+)`: `((?:decode|extend|tree_verify|gdn_\w+|causal_conv1d)/[^`,…]*)", DOC.read_text())
    assert cited
    for backend, case in cited:
        case = case.strip()
        globs = [
            (e["backend"], g) for e in entries for g in ([e["cases"]] if isinstance(e["cases"], str) else e["cases"])
        ]
        assert any(
            b == backend and (g.startswith(case) or fnmatch.fnmatchcase(case, g) or case.startswith(g.rstrip("*")))
            for b, g in globs
        ), (backend, case)
