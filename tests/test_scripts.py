"""scripts.py's two registries: `Script` (a script called by hash owns its SHA1) and `LUA` (the
constants that are Lua, and the only ones the mutation gate loads as Lua)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from taskcustody import scripts
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parents[1]


def test_a_scripts_sha_is_the_name_redis_gives_it(backend: Backend) -> None:
    client = backend.client()
    for script in (scripts.RECORD_SCRIPT, scripts.RELEASE_SCRIPT,
                   scripts.TAKE_AND_RECORD_SCRIPT, scripts.RELEASE_AND_TAKE_SCRIPT):
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


def _check_syntax(text: str) -> subprocess.CompletedProcess[str]:
    """mutation.gate.check_syntax on `text` as scripts.py, in a process of its own (a second Lua
    runtime in the process that fakeredis loaded one into segfaults)."""
    code = textwrap.dedent("""
        import sys
        from mutation.gate import check_syntax
        check_syntax("src/taskcustody/scripts.py", sys.stdin.read())
    """)
    return subprocess.run([sys.executable, "-c", code], input=text, capture_output=True,
                          text=True, cwd=ROOT, timeout=60, check=False)


def test_the_gate_loads_only_the_lua_constants_as_lua() -> None:
    """What made the script-hash clean-up fail the gate once: a constant that is a string but not
    Lua (a SHA1) was loaded as a script. And a Lua script of `LUA` that does not compile is still
    caught."""
    source = (ROOT / "src/taskcustody/scripts.py").read_text(encoding="utf-8")
    assert _check_syntax(source).returncode == 0
    with_sha = source + '\nRELEASE_SHA = "0123456789abcdef0123456789abcdef01234567"\n'
    ok = _check_syntax(with_sha)
    assert ok.returncode == 0, ok.stderr
    broken = source.replace("RELEASE_AND_TAKE = _RELEASE_STEP + _TAKE_NEXT\n",
                            'RELEASE_AND_TAKE = _RELEASE_STEP + "end end"\n')
    assert broken != source
    failed = _check_syntax(broken)
    assert failed.returncode != 0 and "RELEASE_AND_TAKE does not compile" in failed.stderr
