"""docs/specification.md stays true: every test it links to exists, every rule links
to one, and every citation of a section anywhere in the tree names a section that
exists. The external brief it replaced is cited nowhere."""

from __future__ import annotations

import ast
import functools
import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = ROOT / "docs" / "specification.md"
TEXT = SPEC.read_text(encoding="utf-8")

# [`tests/x/test_y.py::test_z`](../tests/x/test_y.py)
TEST_LINK = re.compile(r"\[`?(tests/[\w/]+\.py)::(\w+)`?\]\(([^)]+)\)")
HEADING = re.compile(r"^#{2,4} §(\d+(?:\.\d+)*) ", re.M)
ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
# A rule is a list item that opens with its anchor.
RULE = re.compile(r'^- <a id="([^"]+)"></a>', re.M)
GAPS_HEADING = "## §10 "
# "docs/specification.md §3.6", "specification.md §5.3, §5.4", "§4.1-§4.3" (or an en dash)
CITATION = re.compile(r"specification\.md((?:\s*(?:,|and|\u2013|-)?\s*§\d+(?:\.\d+)*)+)")
# Spelled in parts, so that this file does not cite what it looks for.
OLD_BRIEF = re.compile("BRIEF" + r"\.md|\b[Bb]rief" + r" §|BRIEF" + r" §", re.M)

TEXT_SUFFIXES = {".py", ".pyi", ".proto", ".md", ".ts", ".js", ".json", ".toml", ".yaml", ".yml", ".sh", ".sql", ".txt"}
SKIPPED_DIRS = {
    ".git",
    ".venv",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "funnel-data",
    "third_party",
}


def tree_files() -> list[pathlib.Path]:
    found = []
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        found += [pathlib.Path(directory, f) for f in files if pathlib.Path(f).suffix in TEXT_SUFFIXES]
    return found


@functools.cache
def defined_functions(path: pathlib.Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def rules_and_bodies() -> list[tuple[str, str]]:
    """(anchor, text up to the next rule or heading) of every rule outside the gaps section."""
    body = TEXT.split(GAPS_HEADING, 1)[0]
    starts = [(m.start(), m.group(1)) for m in RULE.finditer(body)]
    bounds = sorted(
        {m.start() for m in RULE.finditer(body)} | {m.start() for m in HEADING.finditer(body)} | {len(body)}
    )
    return [(anchor, body[start : min(b for b in bounds if b > start)]) for start, anchor in starts]


def test_every_test_link_names_an_existing_test_function():
    links = TEST_LINK.findall(TEXT)
    assert len(links) > 100, "the links were not found: has their form changed?"
    broken = []
    for path, name, target in links:
        file = (SPEC.parent / target).resolve()
        if file != (ROOT / path).resolve():
            broken.append(f"{path}::{name} links to {target}")
        elif not file.is_file():
            broken.append(f"{path} does not exist")
        elif not name.startswith("test_") or name not in defined_functions(file):
            broken.append(f"{path} has no test function {name}")
    assert not broken, "\n".join(broken)


def test_every_rule_links_to_a_test():
    rules = rules_and_bodies()
    assert len(rules) > 50, "the rules were not found: has their form changed?"
    untested = [anchor for anchor, body in rules if not TEST_LINK.search(body)]
    assert not untested, f"rules without a test (prove them, or move them to the gaps section): {untested}"


def test_anchors_are_unique_and_sections_numbered_in_order():
    anchors = ANCHOR.findall(TEXT)
    assert len(anchors) == len(set(anchors)), sorted(a for a in anchors if anchors.count(a) > 1)
    sections = [tuple(int(n) for n in number.split(".")) for number in HEADING.findall(TEXT)]
    assert sections == sorted(sections) and len(sections) == len(set(sections)), sections


def test_every_citation_of_the_specification_names_an_existing_section():
    sections = set(HEADING.findall(TEXT))
    wrong = []
    for file in tree_files():
        text = file.read_text(encoding="utf-8", errors="replace")
        for match in CITATION.finditer(text):
            for number in re.findall(r"§(\d+(?:\.\d+)*)", match.group(1)):
                if number not in sections:
                    wrong.append(f"{file.relative_to(ROOT)}: §{number}")
    assert not wrong, "citations of sections that do not exist:\n" + "\n".join(wrong)


def test_the_readme_and_the_architecture_link_to_it_and_the_code_cites_it():
    assert "](docs/specification.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](specification.md)" in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    citing = {
        file.relative_to(ROOT).parts[0]
        for file in tree_files()
        if file.suffix == ".py" and CITATION.search(file.read_text(encoding="utf-8", errors="replace"))
    }
    assert {"lifecycle_service", "completion_service", "funnel"} <= citing, citing


@pytest.mark.parametrize("finder", ["file", "citation"])
def test_nothing_cites_the_external_brief_any_more(finder):
    if finder == "file":
        assert not (ROOT / "docs" / ("BRIEF" + ".md")).exists()
        return
    citing = [
        str(file.relative_to(ROOT))
        for file in tree_files()
        if OLD_BRIEF.search(file.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not citing, f"cite docs/specification.md by section instead: {citing}"
