"""No history in the code's own prose: comments and docstrings say why the code is as it is, not
when it changed, in which commit, or under which tracker number (that is CHANGELOG.md and git).
The README and the docs are held to the same patterns by tests/test_readme.py."""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_readme import HISTORY

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("src", "model", "bench", "mutation", "tests")
#: The file that tests the patterns themselves quotes what they catch.
EXEMPT = {Path("tests/test_readme.py")}


def prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every docstring of a Python source."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                start = node.body[0].lineno
                for offset, line in enumerate(doc.splitlines()):
                    yield start + offset, line


def test_prose_finds_comments_and_docstrings() -> None:
    source = '"""Module, fixed in issue 15."""\nx = "#12"  # see #12\n'
    found = [text for _, text in prose(source)]
    assert "# see #12" in found and "Module, fixed in issue 15." in found
    assert not any("x =" in text for text in found)  # code and its strings are not prose


@pytest.mark.parametrize("kind", sorted(HISTORY))
def test_no_history_in_comments_or_docstrings(kind: str) -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {text.strip()}"
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.relative_to(ROOT) not in EXEMPT
        for n, text in prose(path.read_text(encoding="utf-8"))
        if HISTORY[kind].search(text)
    ]
    assert found == [], kind
