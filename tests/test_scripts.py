"""scripts.py's two registries: `Script` (a script called by hash owns its SHA1) and `LUA` (the
constants that are Lua, and the only ones the mutation gate loads as Lua), and the gate's checks
of a mutant of the Lua."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from taskcustody.core import scripts
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parents[1]


def test_a_scripts_sha_is_the_name_redis_gives_it(backend: Backend) -> None:
    client = backend.client()
    for script in (
        scripts.RECORD_SCRIPT,
        scripts.RELEASE_SCRIPT,
        scripts.TAKE_AND_RECORD_SCRIPT,
        scripts.RELEASE_AND_TAKE_SCRIPT,
    ):
        assert client.script_load(script.source) == script.sha
    client.close()


def test_load_makes_evalsha_find_the_script(backend: Backend) -> None:
    client = backend.client()
    client.script_flush()
    script = scripts.RELEASE_SCRIPT
    assert client.script_exists(script.sha) == [False]
    script.load(client)
    assert client.script_exists(script.sha) == [True]
    client.close()


def test_every_script_called_by_hash_is_listed_as_lua() -> None:
    called = {v.source for v in vars(scripts).values() if isinstance(v, scripts.Script)}
    assert len(called) == 4
    assert called <= set(scripts.LUA.values())
    for name, source in scripts.LUA.items():
        assert getattr(scripts, name) is source, name


def _gate(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`code` run with mutation.gate's checks imported, in a process of its own (a second Lua
    runtime in the process that fakeredis loaded one into segfaults)."""
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from mutation.gate import check_scripts, check_syntax\n" + textwrap.dedent(code)
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def _copy_of_the_scripts(dest: Path) -> Path:
    package = ROOT / "src/taskcustody/core"
    (dest / "taskcustody/core").mkdir(parents=True)
    shutil.copy(package / "scripts.py", dest / "taskcustody/core/scripts.py")
    shutil.copytree(package / "lua", dest / "taskcustody/core/lua")
    return dest / "taskcustody/core"


def test_the_gate_rejects_lua_that_does_not_compile() -> None:
    """A mutated .lua file is loaded as Lua, on its own; a .py file is compiled as Python."""
    lua = "src/taskcustody/core/lua/record.lua"
    text = (ROOT / lua).read_text(encoding="utf-8")
    ok = _gate("check_syntax(sys.argv[1], sys.argv[2])", lua, text)
    assert ok.returncode == 0, ok.stderr
    failed = _gate("check_syntax(sys.argv[1], sys.argv[2])", lua, text + "end\n")
    assert failed.returncode != 0 and f"Lua {lua} does not compile" in failed.stderr
    python = _gate("check_syntax('x.py', 'def (')")
    assert python.returncode != 0 and "SyntaxError" in python.stderr


def test_the_gate_compiles_each_script_as_redis_is_sent_it(tmp_path: Path) -> None:
    """A fragment that compiles on its own can break the scripts that include it (a `return`
    before the code that follows its include line): the gate loads the scripts' module of the
    copy and compiles every script of its `LUA` table, composed."""
    package = _copy_of_the_scripts(tmp_path)
    ok = _gate("check_scripts(Path(sys.argv[1]))", str(package / "scripts.py"))
    assert ok.returncode == 0, ok.stderr
    fragment = package / "lua/lib/record_owned_by.lua"
    fragment.write_text(fragment.read_text(encoding="utf-8") + "return 1\n", encoding="utf-8")
    alone = _gate("check_syntax(sys.argv[1], Path(sys.argv[1]).read_text())", str(fragment))
    assert alone.returncode == 0, alone.stderr
    failed = _gate("check_scripts(Path(sys.argv[1]))", str(package / "scripts.py"))
    assert failed.returncode != 0
    assert "Lua script RELEASE does not compile" in failed.stderr, failed.stderr
