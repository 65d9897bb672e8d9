"""Every ```python block of README.md and docs/**/*.md runs as written: in a fresh interpreter,
against a throwaway redis-server, with the example URL the only thing replaced. A `print(...)`
line that ends with a comment states what it prints, and the output must be exactly those lines.

A block that cannot run as it stands says so on the line above its fence
(`<!-- not-run: why -->`, tests/support/markdown.py); it must still be Python that imports only
what taskcustody exports, unless it is a quote of a file with lines left out
(`<!-- not-run: a quote of PATH ... -->`, checked against PATH by tests/test_docs_guide.py)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.markdown import Block, blocks, documentation, not_run_markers
from tests.support.redis_server import RedisServerProcess, throwaway_redis_server

EXAMPLE_URL = "redis://127.0.0.1:6379/0"
#: `print(...)  # what it prints`: the comment is the line the example says it prints.
STATED_OUTPUT = re.compile(r"^\s*print\(.*\)\s+#\s?(.*)$")

PAGES = documentation()
PYTHON = [b for page in PAGES for b in blocks(page) if b.language == "python"]
RUNNABLE = [b for b in PYTHON if b.not_run is None]
#: Whole Python, run or not: every block but the quotes of a file with lines left out.
WHOLE = [b for b in PYTHON if not (b.not_run or "").startswith("a quote of ")]

# The mutation gate runs the suite in a copy without README.md and docs/ (mutation/gate.py).
pytestmark = pytest.mark.skipif(
    not PAGES, reason="no README.md or docs/ (the mutation gate's copy)"
)


def stated_output(block: Block) -> list[str] | None:
    """The lines the block's comments say it prints, or None if it states none."""
    stated = [m.group(1) for line in block.body.splitlines() if (m := STATED_OUTPUT.match(line))]
    return stated or None


def test_the_documentation_has_runnable_examples() -> None:
    """The collection above found what it should: were the parsing broken, or every block marked
    not-run, the tests below would pass having run nothing."""
    assert len(RUNNABLE) >= 5, [b.where for b in RUNNABLE]
    readme = [b for b in RUNNABLE if b.path.name == "README.md"]
    assert readme, "the README's first queue must be a runnable example"
    assert sum(stated_output(b) is not None for b in RUNNABLE) >= 3


def test_every_not_run_marker_stands_above_a_python_block() -> None:
    """A marker that slid away from its block (an edit put a line between them) would leave the
    block running and the marker saying nothing: each one must be right above a fence."""
    for page in PAGES:
        marked = {b.line - 1 for b in blocks(page) if b.not_run is not None}
        assert not_run_markers(page) == sorted(marked), page


@pytest.mark.parametrize("block", WHOLE, ids=[b.where for b in WHOLE])
def test_every_python_block_parses_and_imports_what_exists(block: Block) -> None:
    import taskcustody

    tree = ast.parse(block.body, filename=block.where)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "taskcustody":
            missing = [a.name for a in node.names if not hasattr(taskcustody, a.name)]
            assert not missing, f"{block.where} imports {missing} from taskcustody"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServerProcess]:
    with throwaway_redis_server() as started:
        yield started


@pytest.mark.real_redis
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_every_runnable_block_runs_and_prints_what_it_says(
    block: Block,
    server: RedisServerProcess,
    tmp_path: Path,
) -> None:
    client = redis.Redis.from_url(server.url)
    client.flushall()  # each example starts from an empty Redis, as a reader's would
    client.close()
    assert block.body.count(EXAMPLE_URL) <= 1, block.where
    result = subprocess.run(
        [sys.executable, "-c", block.body.replace(EXAMPLE_URL, server.url)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, f"{block.where}\n{result.stderr}"
    expected = stated_output(block)
    if expected is not None:
        assert result.stdout.splitlines() == expected, block.where


def test_stated_output_reads_the_comments_of_print_lines_only() -> None:
    """The parser can fail: a comment on another line is not a statement of output."""
    block = Block(
        Path("x.md"), 1, "python", 'x = 1  # one\nprint(x)  # 1\nprint("a b")  # a b\n', None
    )
    assert stated_output(block) == ["1", "a b"]
    assert stated_output(Block(Path("x.md"), 1, "python", "print(1)\n", None)) is None
