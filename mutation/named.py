"""The named mutants: hand-written, exact rewrites of the real implementation's protocol lines.

Each mutant is a list of edits. An edit names a file, an anchor (text that must occur in that file
exactly once) and its replacement. The gate applies a mutant to a throwaway copy of the tree and
runs the whole test suite there; the suite must go red. An anchor that no longer occurs exactly
once fails the gate as *stale*: the code moved, and the mutant must be rewritten to hit it again.

mutmut cannot make these: it never deletes a statement, renames a Redis command, reorders two
calls, or negates a bare `if include_self:` (none of mutmut 3.8.1's operators does).

A named mutant may carry an `equivalence`: a reviewed argument that the rewrite cannot change any
observable behaviour of *this* implementation. The argument rests on lines quoted in `pinned`
(each must still occur exactly once, or the review is stale and the gate fails). A reviewed
mutant is still run: if the suite ever kills it, the review is wrong or out of date, and the gate
fails too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = "src/taskcustody/core/worker.py"
CUSTODY = "src/taskcustody/core/custody.py"
OUTCOME = "src/taskcustody/core/outcome.py"
LOOP = "src/taskcustody/core/loop.py"
RECOVERY = "src/taskcustody/core/recovery.py"
# The Lua scripts (src/taskcustody/core/scripts.py loads them): one file each, and the fragments
# several include (lua/lib/).
LUA = "src/taskcustody/core/lua/"
RELEASE_STEP = LUA + "lib/release_step.lua"
RELEASE_LUA = LUA + "release.lua"
RELEASE_AND_TAKE_LUA = LUA + "release_and_take.lua"
TAKE_AND_RECORD_LUA = LUA + "take_and_record.lua"
DRAIN_CHUNK_LUA = LUA + "drain_chunk.lua"
REQUEUE_STUCK_LUA = LUA + "requeue_stuck.lua"
SERVER = "src/taskcustody/core/server.py"
PREFETCH = "src/taskcustody/core/prefetch.py"
SETTINGS = "src/taskcustody/core/settings.py"
SUSPECTS = "src/taskcustody/core/suspects.py"
AIO_WORKER = "src/taskcustody/aio/worker.py"
AIO_PREFETCH = "src/taskcustody/aio/prefetch.py"


@dataclass(frozen=True)
class Edit:
    path: str
    anchor: str
    replacement: str


@dataclass(frozen=True)
class Equivalence:
    reason: str
    # (path, exact text) the argument depends on: an edit to any of them reopens the review.
    pinned: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class NamedMutant:
    name: str
    breaks: str
    edits: tuple[Edit, ...]
    equivalence: Equivalence | None = field(default=None)


MUTANTS: tuple[NamedMutant, ...] = (
    NamedMutant(
        "blpop-take",
        "no loss: the take pops the task with nothing in the in-flight list (the old BLPOP "
        "design, from the same end: BRPOP), and the processing record is the only trace, "
        "written after the reply; the release then finds no custody to give up",
        (
            Edit(
                CUSTODY,
                '        if self.take_command == "BLMOVE":\n'
                '            return ("BLMOVE", self.keys.queue, self.list_key, "RIGHT", "LEFT", '
                "block)\n"
                '        return ("BRPOPLPUSH", self.keys.queue, self.list_key, block)\n',
                '        return ("BRPOP", self.keys.queue, block)\n',
            ),
            Edit(
                WORKER,
                "            raw = self._call(*self._take_args(block), "
                "first=self.registration())\n",
                "            popped = self._call(*self._take_args(block), "
                "first=self.registration())\n"
                "            raw = None if popped is None else popped[1]\n",
            ),
        ),
    ),
    NamedMutant(
        "run-once-skips-reconcile",
        "no loss (the production loop): `run_once` takes without draining its "
        "own list when dirty, so a take whose reply was lost leaves its task behind; the "
        "step-driven machine calls `reconcile` itself and does not see it, the loop-driven run "
        "(tests/stateful/test_production_loops.py) does",
        (
            Edit(
                WORKER,
                "            if self.dirty:\n"
                "                self.reconcile()\n"
                "            task = self.take(timeout)\n",
                "            task = self.take(timeout)\n",
            ),
        ),
    ),
    NamedMutant(
        "no-release",
        "no duplication / bounded custody: the release commits without removing the task from "
        "the in-flight list, which stays there for a drain to requeue",
        (
            Edit(
                RELEASE_STEP,
                "local held = redis.call('LREM', own, 1, raw)\n",
                "local held = 1\n",
            ),
        ),
    ),
    NamedMutant(
        "release-outside-finally",
        "eventually empty: an interrupted worker (KeyboardInterrupt, SystemExit) never releases; "
        "the task is parked in a live worker's list",
        (
            Edit(
                WORKER,
                "            raise\n"
                "        finally:\n"
                "            # Custody is released whatever happened above; an interrupted cycle "
                "takes nothing.\n"
                "            if ran and self.take_next():\n"
                "                self._next = self.release_and_take(task, outcome)[1]\n"
                "            else:\n"
                "                self.release(task, outcome)\n",
                "            raise\n"
                "        if ran and self.take_next():\n"
                "            self._next = self.release_and_take(task, outcome)[1]\n"
                "        else:\n"
                "            self.release(task, outcome)\n",
            ),
        ),
    ),
    NamedMutant(
        "startup-skips-own",
        "eventually empty: the startup drain skips the own id's lists; debris of an earlier run "
        "is parked forever",
        (
            Edit(
                SERVER,
                "            include_self=True,\n            chunk=self.settings.drain_chunk,\n",
                "            include_self=False,\n            chunk=self.settings.drain_chunk,\n",
            ),
        ),
    ),
    NamedMutant(
        "sweep-include-self-true",
        "no double assignment: the periodic sweep drains the own server's lists while its "
        "workers execute those tasks",
        (
            Edit(
                RECOVERY,
                "        me,\n        include_self=False,\n        chunk=chunk,\n",
                "        me,\n        include_self=True,\n        chunk=chunk,\n",
            ),
        ),
    ),
    NamedMutant(
        "processing-sweep-no-custody",
        "no duplication: the processing sweep requeues a task without removing it from its "
        "holder's list, so the drain requeues it a second time",
        (
            Edit(
                REQUEUE_STUCK_LUA,
                "    redis.call('LREM', holder_list, 1, raw)\n",
                "",
            ),
        ),
    ),
    NamedMutant(
        "unbounded-drain",
        "bounded work: the drain loops until the list is empty instead of at most LLEN moves "
        "read up front; it never ends under a concurrent appender",
        (
            Edit(
                RECOVERY,
                "    while moved < budget:\n",
                "    while True:\n",
            ),
            Edit(
                RECOVERY,
                "        limit = min(chunk, budget - moved)\n",
                "        limit = chunk\n",
            ),
        ),
    ),
    NamedMutant(
        "gc-when-empty",
        "registered custody (design 9): the sweep's garbage collection forgets a dead owner's "
        "empty list however young its registration (the cutoff is now, not now - grace), so a "
        "take sent just before the owner was judged dead can fill a list recovery no longer "
        "knows; the loop-driven runs (the worker's, the prefetching worker's and the server's "
        "loops), whose registrations age (`Bounds.registration_ages`, a grace of one tick), see "
        "Redis forget a registration the model keeps",
        (
            Edit(
                RECOVERY,
                "        client, keys, registered, live, me, now - grace\n",
                "        client, keys, registered, live, me, now\n",
            ),
        ),
    ),
    NamedMutant(
        "drain-before-prune",
        "prompt recovery: the sweep decides which lists are dead before it prunes expired "
        "servers (the two calls swapped); liveness is registration, so a server that expired "
        "since the last pass still looks live and its lists are recovered a whole period late",
        (
            Edit(
                RECOVERY,
                "    report.pruned = prune_inactive_servers(client, keys, now)\n"
                "    live = live_owners(client, keys)\n",
                "    live = live_owners(client, keys)\n",
            ),
            Edit(
                RECOVERY,
                "    report.requeued_stuck, report.stale_records = "
                "requeue_stuck_processing_tasks(\n",
                "    report.pruned = prune_inactive_servers(client, keys, now)\n"
                "    report.requeued_stuck, report.stale_records = "
                "requeue_stuck_processing_tasks(\n",
            ),
        ),
    ),
    NamedMutant(
        "prefetch-take-without-custody",
        "no loss: the prefetching take pops the task (RPOP) instead of moving it into the slot's "
        "in-flight list -- BLPOP's flaw again, in the batched path; a lost reply loses the task",
        (
            Edit(
                TAKE_AND_RECORD_LUA,
                "local raw = redis.call('LMOVE', source, own, 'RIGHT', 'LEFT')\n",
                "local raw = redis.call('RPOP', source)\n",
            ),
        ),
    ),
    NamedMutant(
        "prefetch-release-outside-finally",
        "eventually empty: an interrupted prefetching worker never releases its batch; the tasks "
        "it ran and those it had not reached are parked in a live worker's lists",
        (
            Edit(
                PREFETCH,
                "        finally:\n            releases = self.release_all(batch)\n",
                "        except BaseException:\n"
                "            raise\n"
                "        releases = self.release_all(batch)\n",
            ),
        ),
    ),
    NamedMutant(
        "socket-timeout-shorter-than-block",
        "liveness of a take: the socket timeout is shorter than the server-side block, so an "
        "idle, healthy take looks like a dead connection (and its task may be taken unseen)",
        (
            Edit(
                SETTINGS,
                "        return self.block_timeout + self.socket_timeout_margin\n",
                "        return self.block_timeout / 2\n",
            ),
        ),
    ),
    NamedMutant(
        "register-once",
        "registered custody: the old design; a list is registered once, by the claim, and "
        "neither a take nor a heartbeat that finds its registration gone registers it again, so "
        "after Redis lost its data (or a sweep forgot the list) a take fills a list that no "
        "recovery can find",
        (
            Edit(
                CUSTODY,
                '        return ("ZADD", self.keys.inflight_registry, repr(self.clock.now()), '
                "self.list_key)\n",
                "        return None\n",
            ),
            Edit(
                SERVER,
                "        lists = self.list_keys()\n",
                "        lists: list[str] = []\n",
            ),
            Edit(
                TAKE_AND_RECORD_LUA,
                "redis.call('ZADD', registry, now, own)\n",
                "",
            ),
        ),
    ),
    NamedMutant(
        "recoveries-not-counted",
        "bounded executions: recovery counts nothing (every recovery reads a count of 1), so a "
        "task that kills each process that runs it is requeued for ever and takes the fleet down",
        (
            Edit(
                LUA + "lib/recovered.lua",
                "  local n = redis.call('HINCRBY', counts, id, 1)\n",
                "  local n = 1\n",
            ),
        ),
    ),
    NamedMutant(
        "recovered-to-queue",
        "suspects run alone: recovery pushes a counted task back to the queue's take end (the "
        "design before suspects), beside the tasks that died with it, so the next process takes "
        "them together again and an innocent task is dead-lettered with a poison pill",
        (
            Edit(
                DRAIN_CHUNK_LUA,
                "    redis.call('LMOVE', inflight, suspects, 'RIGHT', 'LEFT')\n",
                "    redis.call('LMOVE', inflight, queue, 'RIGHT', 'RIGHT')\n",
            ),
            Edit(
                REQUEUE_STUCK_LUA,
                "      redis.call('LPUSH', suspects, raw)\n",
                "      redis.call('RPUSH', queue, raw)\n",
            ),
        ),
    ),
    NamedMutant(
        "promote-copies",
        "no duplication: the promotion of a due retry LPUSHes it on the queue without the ZREM "
        "that takes it out of the scheduled set, so the task is in two places and every later "
        "promotion pushes it again (design 13)",
        (
            Edit(
                LUA + "promote.lua",
                "  if redis.call('ZREM', scheduled, raw) == 1 then\n",
                "  if true then\n",
            ),
        ),
    ),
)


# The composite step, RELEASE_AND_TAKE: three ways to write it wrongly. Its release is
# the fragment RELEASE includes too (lib/release_step.lua, after lib/release_arguments_checked.lua),
# so the mutants of the composite step alone rewrite release_and_take.lua around those includes.
_RELEASE_INCLUDES = (
    "--#include lib/release_arguments_checked.lua\n--#include lib/release_step.lua\n"
)

# The take moves the next task in first; the release and a tail that replies follow, and the
# script's real take after them is never reached (`do return ... end`).
_TAKE_FIRST = (
    "local source = queue\n"
    "if take == 'suspect' and redis.call('LLEN', suspects) > 0 then source = suspects end\n"
    "local taken = false\n"
    "if take ~= '' then taken = redis.call('LMOVE', source, own, 'RIGHT', 'LEFT') end\n"
    "local id = ''\n"
    "if taken then\n"
    "  redis.call('ZADD', registry, now, own)\n"
    "  local ok, task = pcall(cjson.decode, taken)\n"
    "  if ok and type(task) == 'table' and type(task['id']) == 'string' then\n"
    "    id = task['id']\n"
    "    redis.call('HSET', processing, id, record)\n"
    "  end\n"
    "end\n" + _RELEASE_INCLUDES + "local left = redis.call('LLEN', own) - (taken and 1 or 0)\n"
    "if not taken then do return {held, left, redis.call('LLEN', suspects)} end end\n"
    "do return {held, left, redis.call('LLEN', suspects), taken, id, "
    "source == suspects and 1 or 0} end\n"
)


def _commits_unheld() -> str:
    """The release step's text, committing whether or not the task was held, in the place of its
    include line in release_and_take.lua only (RELEASE keeps the real step)."""
    step = (ROOT / RELEASE_STEP).read_text(encoding="utf-8")
    return step.replace("if held == 1 then", "if true then")


MUTANTS += (
    NamedMutant(
        "composite-takes-before-release",
        "no double execution / custody: the composite step moves the next task into the list "
        "before it releases the one just handled, so a task that recovery had put back on the "
        "queue's take end comes back into the list, the release finds it there and commits a "
        "run whose custody was lost, deletes the record it just wrote, and the worker runs the "
        "task again with no custody",
        (Edit(RELEASE_AND_TAKE_LUA, _RELEASE_INCLUDES, _TAKE_FIRST),),
    ),
    NamedMutant(
        "composite-takes-without-record",
        "the processing record: the composite step moves the next task into custody without "
        "writing its record, so the processing sweep and `status` cannot see it run",
        (Edit(RELEASE_AND_TAKE_LUA, "  redis.call('HSET', processing, id, record)\n", ""),),
    ),
    NamedMutant(
        "composite-commits-unheld",
        "no double commit: the composite step's release commits whether or not the task was "
        "still in the own list (design 15), so a worker judged dead "
        "commits a task that recovery already handed to another worker",
        (Edit(RELEASE_AND_TAKE_LUA, "--#include lib/release_step.lua\n", _commits_unheld()),),
    ),
)


# Refusals: the scripts that must turn an attempt down. The stateful machine
# with refusals (`refusing.with_refusals`) attempts each: tests/stateful/test_refusals.py.
MUTANTS += (
    NamedMutant(
        "claim-ignores-live-holder",
        "one live process per server id: the claim takes the id whatever the holder's deadline, "
        "so a second process supersedes a live, heart-beating one",
        (
            Edit(
                LUA + "claim.lua",
                "if current and tonumber(current) > tonumber(now) then",
                "if false then",
            ),
        ),
    ),
    NamedMutant(
        "drain-ignores-live-owner",
        "never drain a live server's list: the sweep's drain (dead-only) no longer re-checks "
        "that the list's owner is still not live, so a drain whose owner re-registered since "
        "the sweep looked moves tasks a live worker holds back to the queue",
        (
            Edit(
                DRAIN_CHUNK_LUA,
                "if mode ~= 'force' and is_live(servers, incarnations, server_id, "
                "incarnation) then",
                "if false then",
            ),
        ),
    ),
    NamedMutant(
        "heartbeat-accepts-superseded",
        "one live process per server id: the heartbeat script renews the registration whatever "
        "incarnation holds the id, so a superseded process's heartbeat takes the id back from "
        "the newer one (the refusal part's walk to a superseded heartbeat meets it)",
        (
            Edit(
                LUA + "heartbeat.lua",
                "if current and current ~= incarnation then return 0 end",
                "if false then return 0 end",
            ),
        ),
    ),
    NamedMutant(
        "superseded-heartbeat-goes-on",
        "a superseded process stops: once it has learnt that it was superseded, a later "
        "heartbeat that Redis refuses no longer stops it (no `Superseded`), so it goes on "
        "working under an id it no longer holds; only an attempt of what the model refuses (a "
        "superseded process's heartbeat) can see it",
        (
            Edit(
                SERVER,
                "        if not int(ok):\n            self.superseded = True\n",
                "        if not int(ok) and not self.superseded:\n"
                "            self.superseded = True\n",
            ),
        ),
    ),
)


# The production loops: the loops part of the default `verify` drives the
# server's background thread (`Server._background`, verify/server_loop.py, which checks its sweep
# cadence) and the prefetching worker's cycle (`PrefetchingWorker.run`, verify/prefetch_loop.py).
MUTANTS += (
    NamedMutant(
        "background-sweeps-once",
        "no loss (recovery happens): the server's background thread sweeps at its first beat and "
        "never again, so a dead server's tasks wait in its lists for ever unless another server "
        "sweeps; the step-driven machine calls `sweep` itself and does not see it, the loops "
        "part of the default verify run (verify/server_loop.py's cadence check) does",
        (
            Edit(
                SERVER,
                "                if waited >= next_sweep:\n",
                "                if next_sweep == 0.0:\n",
            ),
        ),
    ),
    NamedMutant(
        "prefetch-run-once-skips-reconcile",
        "no loss (the prefetching worker's cycle): `PrefetchingWorker.run_once` "
        "takes for every slot without draining the dirty ones first, so a pipelined take whose "
        "reply was lost leaves its task behind; the prefetching machine sends its pipelines "
        "itself and does not see it, the loops part of the default verify run "
        "(verify/prefetch_loop.py) does",
        (
            Edit(
                PREFETCH,
                "        for slot in self.slots:\n"
                "            if slot.dirty:\n"
                "                slot.reconcile()\n"
                "        batch, error = self.take_all()\n",
                "        batch, error = self.take_all()\n",
            ),
        ),
    ),
)


# Found by verify's fault-coverage part and its production-loops part: the slot
# compared list keys by identity (tests/regressions/test_suspect_slot_freed_by_a_restarted_worker).
MUTANTS += (
    NamedMutant(
        "suspect-slot-by-identity",
        "suspects keep running: the suspect slot is freed only by the very string object that "
        "took it, so a worker restarted after a crash (its list key equal but built anew) "
        "never frees its predecessor's slot and its process runs no suspect again",
        (
            Edit(
                SUSPECTS,
                "            if self._holder == who:\n                self._holder = None",
                "            if self._holder is who:\n                self._holder = None",
            ),
        ),
    ),
)


# A release Redis refuses writes nothing (lua/lib/release_arguments_checked.lua): the check of
# what Redis could refuse comes before the release's first write. Without it the order is the old,
# non-atomic one: LREM, HDEL, INCR, then the SET that Redis refuses, after the writes.
MUTANTS += (
    NamedMutant(
        "release-refused-half-way",
        "no loss / no commit without its result: the release no longer checks its arguments "
        "before its first write, so a result TTL Redis refuses stops the script after the task "
        "left the in-flight list and was counted committed, with no result stored (and a due "
        "time it refuses, after the task left the list for nowhere)",
        (
            Edit(RELEASE_LUA, "--#include lib/release_arguments_checked.lua\n", ""),
            Edit(RELEASE_AND_TAKE_LUA, "--#include lib/release_arguments_checked.lua\n", ""),
        ),
    ),
)


# The asyncio worker ("the model drives it"): its take, its release and its shielded
# release, each rewritten in the asyncio path only (the take's arguments and the release script
# are shared with the threaded worker, so these anchor at the asyncio call sites). The stateful
# machine driving the asyncio worker (tests/test_verify_async.py, verify/aio.py) and the
# cancellation tests (tests/test_async_cancellation.py) must catch them.
MUTANTS += (
    NamedMutant(
        "async-blpop-take",
        "no loss: the asyncio take pops the task (BRPOP) with nothing in the in-flight list, so a "
        "take whose reply is lost, or cancelled in flight, loses the task",
        (
            Edit(
                AIO_WORKER,
                "            raw = await self._call(*self._take_args(block), "
                "first=self.registration(), take=True)\n",
                '            popped = await self._call("BRPOP", self.keys.queue, block, '
                "first=self.registration(), take=True)\n"
                "            raw = None if popped is None else popped[1]\n",
            ),
        ),
    ),
    NamedMutant(
        "async-release-keeps-custody",
        "no duplication / bounded custody: the asyncio release commits without its LREM, so the "
        "task stays in the in-flight list for a drain to requeue and run again",
        (
            Edit(
                AIO_WORKER,
                "        return self.released(await self._send_release(args, "
                "scripts.RELEASE_SCRIPT), action)\n",
                "        script = scripts.Script(scripts.RELEASE.replace(\n"
                "            \"local held = redis.call('LREM', own, 1, raw)\", "
                '"local held = 1"))\n'
                "        return self.released(await self._send_release(args, script), action)\n",
            ),
        ),
    ),
    NamedMutant(
        "async-release-not-shielded",
        "eventually empty: the asyncio cycle's release is not shielded (`complete`), so a "
        "cancellation that lands while it is in flight abandons it, and a shutdown goes on "
        "while the task is still in the worker's list",
        (
            Edit(
                AIO_WORKER,
                "                    self._next = (await complete(self.release_and_take(task, "
                "outcome)))[1]\n"
                "                else:\n"
                "                    await complete(self.release(task, outcome))\n",
                "                    self._next = (await self.release_and_take(task, "
                "outcome))[1]\n"
                "                else:\n"
                "                    await self.release(task, outcome)\n",
            ),
        ),
    ),
    NamedMutant(
        "async-prefetch-forgets-unread-slots",
        "never ignorant: the asyncio prefetching worker reads the replies a lost connection cut "
        "off as empty ones, so the slots after a lost take reply forget the tasks their takes "
        "moved into their lists (not dirty, never reconciled), and a lost release reply is read "
        "as a release that ran",
        (
            Edit(
                AIO_PREFETCH,
                "            return replies, exc\n",
                "            return replies + [None] * (len(commands) - len(replies)), exc\n",
            ),
        ),
    ),
    NamedMutant(
        "async-prefetch-release-not-shielded",
        "eventually empty: the asyncio prefetching worker's batch release is not shielded "
        "(`complete`), so a cancellation that lands while it is in flight abandons it, and the "
        "batch's tasks stay in the slots' lists",
        (
            Edit(
                AIO_PREFETCH,
                "                releases = await complete(self.release_all(batch))\n",
                "                releases = await self.release_all(batch)\n",
            ),
        ),
    ),
    NamedMutant(
        "cancelled-release-ran",
        "eventual recovery (design 16): the asyncio release takes a cancellation for a release "
        "that ran: the worker stays clean and frees its suspect slot, so a release cancelled "
        "before it was sent leaves its task in the list of a worker that believes itself clean",
        (
            Edit(
                AIO_WORKER,
                "        return self.released(await self._send_release(args, "
                "scripts.RELEASE_SCRIPT), action)\n",
                "        try:\n"
                "            return self.released(await self._send_release(\n"
                "                args, scripts.RELEASE_SCRIPT), action)\n"
                "        except asyncio.CancelledError:\n"
                "            self.dirty = False\n"
                "            self.suspects.release(self.list_key)\n"
                "            raise\n",
            ),
        ),
    ),
)


def by_name(name: str) -> NamedMutant:
    for m in MUTANTS:
        if m.name == name:
            return m
    raise KeyError(name)
