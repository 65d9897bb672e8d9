"""The Lua scripts: each is one atomic step of the protocol.

A script is atomic in Redis, so whatever a script does happens entirely or not at all, and no other
client sees a half-done step. That is how custody moves: a task leaves a holder's in-flight list in
the same step that puts it somewhere else. Every key a script touches is passed in KEYS and shares
the queue's hash tag, so the scripts run on Redis Cluster too.

Processing records are stored as "<in-flight list key> <started>" so that a script can tell whose
record it is with one string comparison (list keys never contain spaces).

Each script is a file, `lua/<name>.lua`, read once, when this module is imported. Its header says
what it does and why, then binds every KEYS and ARGV entry to a named local; the body uses only
those names. Code that several scripts share is a fragment, `lua/lib/<name>.lua`, which a script
names on a line of its own, `--#include lib/<name>.lua`: `compose` puts the fragment's text in
that line's place (one level: fragments include nothing). A fragment defines functions, or is a
step that reads the locals of the headers of the scripts that include it (`lib/release_step.lua`).
Redis is sent the composed text without its comments (`without_comments`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis

#: The longest result TTL, in seconds (some 31 million years; Settings.result_ttl is kept at most
#: this, and RELEASE refuses more: lua/lib/release_arguments_checked.lua, which writes it out, and
#: tests/test_lua_files.py checks that the two agree): Redis refuses a `SET ... EX` above
#: LLONG_MAX / 1000 s or one whose milliseconds overflow once added to its clock, some
#: 9.22 * 10**15 s today, and 10**15 stays below that for millions of years; it is exact as a Lua
#: number (a double), so the script compares it exactly. Defined here, not in settings.py: this
#: module imports nothing of ours (the mutation gate loads it on its own).
MAX_RESULT_TTL = 10**15

#: The scripts' directory: next to this module, wherever the two are installed together.
LUA_DIR = Path(__file__).with_name("lua")

# pragma: no mutate start
# (mutmut: what follows runs once, when the module is imported, before a mutmut run picks its
# mutant, so no mutant of it could ever be seen; the named mutants rewrite the Lua itself, and
# tests/test_lua_files.py checks the loading.)

#: A fragment's include line: `--#include lib/NAME.lua`, on a line of its own (a Lua comment, so
#: a script file still compiles as it stands).
_INCLUDE = re.compile(r"^--#include (lib/[a-z_]+\.lua)\n", re.MULTILINE)


def compose(text: str, read: Callable[[str], str]) -> str:
    """The script `text` with each include line replaced by the fragment it names (`read` gives
    a file's text by its path under the scripts' directory). One level only: a fragment that
    includes another is refused, so what a script sends is its own file plus the fragments it
    names, in the order it names them."""

    def fragment(match: re.Match[str]) -> str:
        included = read(match.group(1))
        if _INCLUDE.search(included):
            raise ValueError(f"{match.group(1)} includes another fragment (one level only)")
        return included

    return _INCLUDE.sub(fragment, text)


#: What Redis is not sent: a line that is only a comment, and a header declaration's trailing
#: comment. The scripts hold no long strings (`[[`; tests/test_lua_files.py checks), so a line
#: that starts with `--` is a comment. Its line stays, empty, so that the line numbers Redis gives
#: in an error are the composed file's.
_COMMENT_LINE = re.compile(r"^[ \t]*--.*$", re.MULTILINE)
_DECLARATION_COMMENT = re.compile(r"^(local \w+ = (?:KEYS|ARGV)\[\d+\])[ \t]+--.*$", re.MULTILINE)


def without_comments(text: str) -> str:
    """`text` without its comments (see `_COMMENT_LINE`): every EVAL sends a script's whole text,
    and the headers' prose would more than double it."""
    return _DECLARATION_COMMENT.sub(r"\1", _COMMENT_LINE.sub("", text))


def _read(path: str) -> str:
    return (LUA_DIR / path).read_text(encoding="utf-8")


def load(name: str) -> str:
    """Script `name` (`lua/<name>.lua`) as Redis is sent it: its file with its includes done,
    without its comments."""
    return without_comments(compose(_read(f"{name}.lua"), _read))


# pragma: no mutate end


# Each script is one file, lua/<name>.lua, whose header says what it does and names every KEYS
# and ARGV entry as a local (tests/test_lua_files.py checks that the body uses only those).
RELEASE = load("release")
RELEASE_AND_TAKE = load("release_and_take")
RECORD = load("record")
TAKE_AND_RECORD = load("take_and_record")
DRAIN_CHUNK = load("drain_chunk")
CLAIM = load("claim")
HEARTBEAT = load("heartbeat")
DEREGISTER = load("deregister")
PRUNE_INACTIVE_SERVERS = load("prune_inactive_servers")
REQUEUE_STUCK = load("requeue_stuck")
FORGET_EMPTY_LIST = load("forget_empty_list")
FORGET_DEAD_EMPTY_LISTS = load("forget_dead_empty_lists")
MIGRATE_LEGACY_REGISTRY = load("migrate_legacy_registry")
PROMOTE = load("promote")
REQUEUE_DEAD = load("requeue_dead")  # deadletters.py
PURGE_DEAD = load("purge_dead")  # deadletters.py
SWEEP_LEASE_ACQUIRE_OR_RENEW = load("sweep_lease_acquire_or_renew")  # sweep_lease.py
SWEEP_LEASE_RELEASE = load("sweep_lease_release")  # sweep_lease.py


#: Every Lua script above, by name (its file is lua/<name in lower case>.lua): what the mutation
#: gate compiles to reject a mutant of the Lua that does not compile (mutation/gate.py). The
#: module's other constants are not Lua.
LUA: dict[str, str] = {
    "RELEASE": RELEASE,
    "RELEASE_AND_TAKE": RELEASE_AND_TAKE,
    "RECORD": RECORD,
    "TAKE_AND_RECORD": TAKE_AND_RECORD,
    "DRAIN_CHUNK": DRAIN_CHUNK,
    "CLAIM": CLAIM,
    "HEARTBEAT": HEARTBEAT,
    "DEREGISTER": DEREGISTER,
    "PRUNE_INACTIVE_SERVERS": PRUNE_INACTIVE_SERVERS,
    "REQUEUE_STUCK": REQUEUE_STUCK,
    "FORGET_EMPTY_LIST": FORGET_EMPTY_LIST,
    "FORGET_DEAD_EMPTY_LISTS": FORGET_DEAD_EMPTY_LISTS,
    "MIGRATE_LEGACY_REGISTRY": MIGRATE_LEGACY_REGISTRY,
    "PROMOTE": PROMOTE,
    "REQUEUE_DEAD": REQUEUE_DEAD,
    "PURGE_DEAD": PURGE_DEAD,
    "SWEEP_LEASE_ACQUIRE_OR_RENEW": SWEEP_LEASE_ACQUIRE_OR_RENEW,
    "SWEEP_LEASE_RELEASE": SWEEP_LEASE_RELEASE,
}


@dataclass(frozen=True)
class Script:
    """A script called by hash, as redis-py's `Script` holds one but without a client (a worker
    sends it on its own connection): its source, sent with EVAL when Redis answers NOSCRIPT, and
    the SHA1 that EVALSHA names it by, computed once."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())

    def load(self, client: redis.Redis) -> None:
        """SCRIPT LOAD: from now on EVALSHA finds it (until the script cache is flushed)."""
        client.script_load(self.source)


# The scripts a worker (worker.py, prefetch.py) calls by hash.
RECORD_SCRIPT = Script(RECORD)
RELEASE_SCRIPT = Script(RELEASE)
TAKE_AND_RECORD_SCRIPT = Script(TAKE_AND_RECORD)
RELEASE_AND_TAKE_SCRIPT = Script(RELEASE_AND_TAKE)
