"""The Lua scripts' files (core/lua/): each script is one file whose header says what it
does and names every KEYS and ARGV entry as a local, the body uses only those names, every file is
loaded, and what Redis is sent is the file with its includes done and its comments left out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from taskcustody.core import scripts
from taskcustody.core.scripts import LUA_DIR, MAX_RESULT_TTL, compose, without_comments

SCRIPT_FILES = sorted(LUA_DIR.glob("*.lua"))
FRAGMENTS = sorted((LUA_DIR / "lib").glob("*.lua"))
DECLARATION = re.compile(r"^local (\w+) = (KEYS|ARGV)\[(\d+)\]")
POSITIONAL = re.compile(r"\b(KEYS|ARGV)\b")


def read(path: str) -> str:
    return (LUA_DIR / path).read_text(encoding="utf-8")


def header(text: str) -> tuple[list[str], list[str], list[str]]:
    """A script's comment, its declarations (up to the first empty line) and its body."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if not line.startswith("--"))
    end = lines.index("", start)
    return lines[:start], lines[start:end], lines[end + 1 :]


def test_the_scripts_are_read_next_to_the_module() -> None:
    """Relative to scripts.py, so the two can move into a subpackage together."""
    assert Path(scripts.__file__).resolve().parent / "lua" == LUA_DIR.resolve()
    assert len(SCRIPT_FILES) >= 18 and len(FRAGMENTS) >= 5


def test_every_file_is_loaded_by_some_script() -> None:
    """A script file per entry of `LUA` (named after it), and every fragment included by one."""
    assert {path.stem.upper() for path in SCRIPT_FILES} == set(scripts.LUA)
    for path in SCRIPT_FILES:
        assert scripts.LUA[path.stem.upper()] == without_comments(compose(path.read_text(), read))
    included = {
        name
        for path in SCRIPT_FILES
        for name in re.findall(r"^--#include (lib/\S+)$", path.read_text(), re.M)
    }
    assert included == {f"lib/{path.name}" for path in FRAGMENTS}


@pytest.mark.parametrize("path", SCRIPT_FILES, ids=[p.stem for p in SCRIPT_FILES])
def test_a_scripts_header_names_every_key_and_argument(path: Path) -> None:
    """The header: a comment that starts with the script's name, then a local for each KEYS[i]
    and ARGV[i], numbered from 1 without a gap (a script that takes a variable number of keys
    collects the rest into a table there too). Below it, and in what it includes, neither KEYS nor
    ARGV appears, and every name the header declares is used."""
    comment, declarations, body = header(path.read_text(encoding="utf-8"))
    assert comment[0].startswith(f"-- {path.stem.upper()}: "), comment[0]
    assert len(comment) >= 3
    named: dict[str, list[int]] = {"KEYS": [], "ARGV": []}
    names = []
    for line in declarations:
        match = DECLARATION.match(line)
        if match:
            names.append(match[1])
            named[match[2]].append(int(match[3]))
    for table, numbers in named.items():
        assert numbers == list(range(1, len(numbers) + 1)), (table, numbers)
    assert named["KEYS"], "a script touches at least one key"
    composed = without_comments(compose("\n".join(body) + "\n", read))
    assert not POSITIONAL.search(composed), POSITIONAL.findall(composed)
    for name in names:
        assert re.search(rf"\b{name}\b", composed), f"{name} is declared but not used"


@pytest.mark.parametrize("path", FRAGMENTS, ids=[p.stem for p in FRAGMENTS])
def test_a_fragment_says_what_it_is_and_takes_no_key_itself(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("-- ") and not POSITIONAL.search(without_comments(text))
    assert "--#include" not in text


@pytest.mark.parametrize("path", SCRIPT_FILES + FRAGMENTS, ids=lambda p: p.name)
def test_no_long_strings_so_a_dash_dash_line_is_a_comment(path: Path) -> None:
    """`without_comments` removes every line that starts with `--`: only a long string (`[[`)
    could hold such a line that is not a comment."""
    assert "[[" not in path.read_text(encoding="utf-8")


def test_the_release_refuses_the_ttl_bound_the_settings_keep() -> None:
    """The bound is written out in the Lua (a Lua number prints as 1e+15, so the error message
    spells it); Settings keeps result_ttl at most MAX_RESULT_TTL."""
    check = read("lib/release_arguments_checked.lua")
    assert f"tonumber(result_ttl) > {MAX_RESULT_TTL} then" in check
    assert f"seconds from 1 to {MAX_RESULT_TTL}')" in check
    assert re.findall(r"\d{10,}", check) == [str(MAX_RESULT_TTL)] * 2


def test_compose_puts_each_fragment_in_place_of_its_include_line() -> None:
    files = {"lib/a.lua": "local function a() return 1 end\n", "lib/b.lua": "local b = 2\n"}
    text = "local k = KEYS[1]\n\n--#include lib/a.lua\n--#include lib/b.lua\nreturn a() + b\n"
    assert compose(text, files.__getitem__) == (
        "local k = KEYS[1]\n\nlocal function a() return 1 end\nlocal b = 2\nreturn a() + b\n"
    )
    # Only a line of its own: an include named inside a comment's prose is left alone.
    prose = "-- see --#include lib/a.lua\n"
    assert compose(prose, files.__getitem__) == prose


def test_compose_refuses_a_fragment_that_includes_another() -> None:
    files = {"lib/a.lua": "--#include lib/b.lua\n", "lib/b.lua": "local b = 2\n"}
    with pytest.raises(ValueError, match="one level only"):
        compose("--#include lib/a.lua\n", files.__getitem__)


def test_compose_fails_on_a_missing_fragment() -> None:
    with pytest.raises(FileNotFoundError):
        compose("--#include lib/no_such_fragment.lua\n", read)


def test_what_redis_is_sent_has_no_comments_and_keeps_its_lines() -> None:
    """Comment lines go empty (line numbers in Redis's errors stay the composed file's), a
    declaration loses its trailing comment, and code, strings included, is untouched."""
    text = (
        "-- RECORD: a comment\n"
        "local own = KEYS[1]   -- the list\n"
        "  -- an indented comment\n"
        "return redis.error_reply('ERR -- not a comment') -- kept: not a declaration\n"
    )
    assert without_comments(text) == (
        "\nlocal own = KEYS[1]\n\n"
        "return redis.error_reply('ERR -- not a comment') -- kept: not a declaration\n"
    )
    for name, source in scripts.LUA.items():
        lines = source.splitlines()
        assert not any(line.lstrip().startswith("--") for line in lines), name
        assert len(lines) == len(compose(read(f"{name.lower()}.lua"), read).splitlines())
