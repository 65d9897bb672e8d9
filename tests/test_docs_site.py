"""The documentation site holds together without building it (CI builds it: `mkdocs build
--strict` in .ci/run): every page is in the nav and every nav entry is a page, every include names
a file that exists, the page `.ci/matrix --full` writes has the markers it writes between, and the
commands the pages tell users to run are the ones CI and the CLI have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.markdown import blocks

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"
CI = ROOT / ".ci" / "run"
MATRIX = ROOT / ".ci" / "matrix"

# The mutation gate runs the suite in a copy of src/, model/, tests/ (no docs/, no mkdocs.yml).
pytestmark = pytest.mark.skipif(
    not (DOCS.is_dir() and MKDOCS.exists()), reason="no docs/ (e.g. the mutation gate's copy)"
)


def nav_pages() -> list[str]:
    """The pages of mkdocs.yml's nav, read as text: yaml's loader would need the python/name tag
    of the mermaid fence's formatter."""
    nav = MKDOCS.read_text().split("\nnav:\n", 1)[1]
    return re.findall(r"^\s*- (?:[^:\n]+: )?([\w./-]+\.md)\s*$", nav, re.M)


def test_every_page_is_in_the_nav_and_every_entry_is_a_page() -> None:
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    listed = nav_pages()
    assert len(listed) == len(set(listed))
    assert sorted(listed) == pages
    assert {
        "index.md",
        "protocol.md",
        "architecture.md",
        "model/phases.md",
        "tested-with.md",
        "local-cluster.md",
    } <= set(listed)


def test_mermaid_is_enabled() -> None:
    text = MKDOCS.read_text()
    assert "pymdownx.superfences" in text and "name: mermaid" in text


def test_every_include_names_a_file_of_the_repository() -> None:
    includes = [
        (page, name)
        for page in DOCS.rglob("*.md")
        for name in re.findall(r'^--8<-- "([^"]+)"$', page.read_text(), re.M)
    ]
    assert len(includes) >= 9  # the benchmark pages and the changelog
    assert [(str(page), name) for page, name in includes if not (ROOT / name).is_file()] == []
    # Figures come from the files the bench commands write, not from copies in the pages.
    assert {name for _, name in includes if name.startswith("bench/results/")} >= {
        "bench/results/latest.md",
        "bench/results/audit.md",
    }


def test_ci_builds_the_site_strictly_after_the_static_checks() -> None:
    text = CI.read_text()
    assert "mkdocs build --strict" in text
    assert (
        text.index("== static checks") < text.index("== docs") < text.index("mkdocs build --strict")
    )


def test_the_tested_with_page_has_the_markers_the_matrix_writes_between() -> None:
    matrix = MATRIX.read_text()
    begin = re.search(r"local begin='([^']+)'", matrix)
    end = re.search(r"local end='([^']+)'", matrix)
    assert begin and end
    assert '"$ROOT/docs/tested-with.md"' in matrix
    page = (DOCS / "tested-with.md").read_text()
    assert page.count(begin.group(1)) == 1 and page.count(end.group(1)) == 1
    table = page.split(begin.group(1), 1)[1].split(end.group(1), 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| Python")]
    assert len(rows) >= 2 and rows[0].startswith("| Python, redis-py |")
    # No date or commit in what the matrix writes: history lives in git.
    assert "date -u" not in matrix.split("docs_page()", 1)[1].split("\n}\n", 1)[0]


def test_ci_runs_the_documented_test_command() -> None:
    """`bash .ci/run` must run exactly the test command of "Running the tests": a CI that ran
    something else (say without `-n auto`, or with a marker that skips a half) would not vouch
    for what the page tells contributors to run."""
    page = DOCS / "development" / "testing.md"
    block = next(b for b in blocks(page) if b.language == "bash")
    commands = [line.split("#")[0].strip() for line in block.body.splitlines()]
    test_command = next(c for c in commands if c.startswith("python -m pytest"))
    ci_lines = [line.strip() for line in CI.read_text().splitlines()]
    assert test_command in ci_lines


@pytest.mark.parametrize("page", ["README.md", "docs/verify-in-ci.md"])
def test_the_ci_example_uses_options_that_exist(page: str) -> None:
    """The "Verify in your CI" workflow: every option it passes to `taskcustody verify` is in
    `verify --help`, every --taskcustody-* option it passes to pytest is the plugin's."""
    from click.testing import CliRunner

    from taskcustody.cli.app import main

    path = ROOT / page
    if not path.exists():
        pytest.skip(f"no {page}")
    [block] = [b for b in blocks(path) if b.language == "yaml" and "taskcustody verify" in b.body]
    text = block.body
    assert "image: redis:7" in text
    verify_help = CliRunner().invoke(main, ["verify", "--help"]).output
    verify_options = re.findall(
        r"--[a-z-]+", text[text.index("taskcustody verify") : text.index("python -m pytest")]
    )
    assert {"--redis-url", "--junit-xml", "--max-seconds"} <= set(verify_options)
    for option in verify_options:
        assert option in verify_help, option
    plugin = (ROOT / "src" / "taskcustody_pytest" / "__init__.py").read_text()
    plugin_options = re.findall(r"--taskcustody-[a-z-]+", text)
    assert "--taskcustody-redis-url" in plugin_options
    for option in plugin_options:
        assert f'"{option}"' in plugin, option
