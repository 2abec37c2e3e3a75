"""docs/design.md, the map a newcomer reads first, stays true to the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = (ROOT / "docs" / "design.md").read_text()
LIMIT_LINES = 450  # a module longer than this does more than one job
LIMIT_CLASS = 300


def modules() -> list[Path]:
    return sorted(p.relative_to(ROOT) for p in (ROOT / "embedx").rglob("*.py"))


def test_the_module_table_names_every_module_and_only_those() -> None:
    listed = set(re.findall(r"^\| `(embedx/[\w/]+\.py)` \|", MAP, flags=re.MULTILINE))
    assert listed == {str(p) for p in modules()}


def test_every_module_says_its_job_and_none_outgrows_one() -> None:
    for path in modules():
        source = (ROOT / path).read_text()
        tree = ast.parse(source)
        assert ast.get_docstring(tree), f"{path} has no docstring saying its job"
        assert len(source.splitlines()) <= LIMIT_LINES, path
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                assert length <= LIMIT_CLASS, f"{path}: class {node.name} is {length} lines"
