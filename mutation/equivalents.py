"""Reviewed equivalent mutmut mutants: a mutant listed here cannot change any behaviour the
protocol or its users can observe, for the reason given.

Each entry is matched on the function, the original line and the exact mutated line (whitespace
at the ends ignored). The mutmut key is not used: numbers shift when a function changes. When
either line changes, the entry stops matching, the mutant counts as a survivor again, and the gate
fails until someone reviews it afresh (the entry that matched nothing is reported, to be deleted).
"""

from __future__ import annotations

_TAKE = 'return ("BLMOVE", self.keys.queue, self.list_key, "RIGHT", "LEFT", block)'
_RECORD = 'self._deferred = ("EVAL", scripts.RECORD, 2, self.list_key, self.keys.processing,'
_DRAIN_MODE = 'owner.incarnation, "force" if force else "dead-only",'
_CASE = (
    "Redis command names and keywords are case-insensitive (real Redis and fakeredis "
    "alike); the command sent is the same command."
)
_NOT_FORCE = (
    "DRAIN_CHUNK treats every mode other than 'force' as dead-only "
    "(`mode ~= 'force'`, lua/drain_chunk.lua), so any other spelling is the same mode."
)

_INCARNATION = (
    "the incarnation comes from INCR on a counter that is never written otherwise, "
    "so it is >= 1; CLAIM returns -1 exactly when it refuses."
)

_PROBE = 'client.lmove(probe, probe, "RIGHT", "LEFT")'
_ROTATE = (
    "the probe only asks whether LMOVE exists: redis-py fills in a missing direction "
    "(LEFT, then RIGHT), and a rotation of the probe key onto itself in any valid "
    "direction moves nothing (the key does not exist) and touches no other key."
)
_TYPES_ZIP = "for (key, want), got in zip(expected.items(), pipe.execute(), strict=True):"
_ONE_REPLY_EACH = (
    "a pipeline returns exactly one reply per queued command (or raises), and "
    "one TYPE is queued per expected key: the lengths always match."
)
_DECODE = "redis-py tests decode_responses for truth only: None is False; replies stay bytes."
_FAKE_CLIENT = "client: redis.Redis = fakeredis.FakeRedis(server=fake_server, retry=no_retry())"
_FAKE_RETRY = (
    "fakeredis (2.41) ignores the retry argument: get_retry() is None with or without "
    "it, and an in-process fake connection has no transport error to retry."
)

_FALSY = "only ever tested for truth: None and False take the same path."
_ALLOW_NAN = (
    "json tests allow_nan for truth only: None and False take the same path (NaN still "
    "raises ValueError with None: checked)."
)

EQUIVALENTS: list[dict[str, str]] = [
    # -- flags tested for truth only ------------------------------------------------------------
    {
        "function": "taskcustody.core.custody._result_json",
        "original": "return json.dumps(result, allow_nan=False)",
        "mutated": "return json.dumps(result, allow_nan=None)",
        "reason": _ALLOW_NAN,
    },
    {
        "function": "taskcustody.core.envelope.encode",
        "original": 'return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()',
        "mutated": 'return json.dumps(body, separators=(",", ":"), allow_nan=None).encode()',
        "reason": _ALLOW_NAN,
    },
    {
        "function": "taskcustody.core.worker.Worker._call",
        "original": "resend_record = False",
        "mutated": "resend_record = None",
        "reason": "resend_record is " + _FALSY,
    },
    # -- core/custody.py: the take and the release -------------------------------------------------
    {
        "function": "taskcustody.core.custody.Custody._take_args",
        "original": _TAKE,
        "mutated": _TAKE.replace('"BLMOVE"', '"blmove"'),
        "reason": _CASE,
    },
    {
        "function": "taskcustody.core.custody.Custody._take_args",
        "original": _TAKE,
        "mutated": _TAKE.replace('"RIGHT"', '"right"'),
        "reason": _CASE,
    },
    {
        "function": "taskcustody.core.custody.Custody._take_args",
        "original": _TAKE,
        "mutated": _TAKE.replace('"LEFT"', '"left"'),
        "reason": _CASE,
    },
    {
        "function": "taskcustody.core.custody.Custody._take_args",
        "original": 'return ("BRPOPLPUSH", self.keys.queue, self.list_key, block)',
        "mutated": 'return ("brpoplpush", self.keys.queue, self.list_key, block)',
        "reason": _CASE,
    },
    {
        "function": "taskcustody.core.worker.Worker._send_release",
        "original": 'return self._call("EVALSHA", sha, *args)',
        "mutated": 'return self._call("evalsha", sha, *args)',
        "reason": _CASE,
    },
    {
        "function": "taskcustody.core.worker.Worker._send_release",
        "original": 'return self._call("EVAL", script.source, *args)',
        "mutated": 'return self._call("eval", script.source, *args)',
        "reason": _CASE,
    },
    {
        "function": "taskcustody.core.worker.Worker.record",
        "original": _RECORD,
        "mutated": _RECORD.replace('"EVAL"', '"eval"'),
        "reason": _CASE,
    },
    {
        "function": "taskcustody.core.worker.Worker.record",
        "original": 'self._send("EVALSHA", scripts.RECORD_SCRIPT.sha, *self._deferred[2:])',
        "mutated": 'self._send("evalsha", scripts.RECORD_SCRIPT.sha, *self._deferred[2:])',
        "reason": _CASE,
    },
    # -- recovery.py ---------------------------------------------------------------------------
    {
        "function": "taskcustody.core.recovery.drain_inflight",
        "original": _DRAIN_MODE,
        "mutated": _DRAIN_MODE.replace('"dead-only"', '"XXdead-onlyXX"'),
        "reason": _NOT_FORCE,
    },
    {
        "function": "taskcustody.core.recovery.drain_inflight",
        "original": _DRAIN_MODE,
        "mutated": _DRAIN_MODE.replace('"dead-only"', '"DEAD-ONLY"'),
        "reason": _NOT_FORCE,
    },
    {
        "function": "taskcustody.core.recovery.live_owners",
        "original": "pipe = client.pipeline(transaction=False)",
        "mutated": "pipe = client.pipeline(transaction=None)",
        "reason": "redis-py tests `transaction` for truth only: None is False.",
    },
    {
        "function": "taskcustody.core.recovery.live_owners",
        "original": "pipe = client.pipeline(transaction=False)",
        "mutated": "pipe = client.pipeline(transaction=True)",
        "reason": "MULTI/EXEC makes the two reads one snapshot; nothing relies on their being "
        "separate or together: the selection is advisory, and every dead-only drain step "
        "re-checks liveness inside its own atomic script.",
    },
    {
        "function": "taskcustody.core.recovery.sweep",
        "original": "report.drained_lists = recover_inflight(client, keys, me, include_self=False, "
        "chunk=chunk)",
        "mutated": "report.drained_lists = recover_inflight(client, keys, me, include_self=None, "
        "chunk=chunk)",
        "reason": "include_self is only tested for truth (`if include_self:` and `force=` "
        "which the "
        "drain tests for truth): None is False.",
    },
    # -- connection.py -------------------------------------------------------------------------
    {
        "function": "taskcustody.deploy.connection.server_version",
        "original": 'info = client.info("server")',
        "mutated": 'info = client.info("SERVER")',
        "reason": "INFO section names are case-insensitive (real Redis; fakeredis has no INFO).",
    },
    {
        "function": "taskcustody.deploy.connection.server_version",
        "original": _PROBE,
        "mutated": _PROBE.replace('"RIGHT"', '"right"'),
        "reason": _CASE,
    },
    {
        "function": "taskcustody.deploy.connection.server_version",
        "original": _PROBE,
        "mutated": _PROBE.replace('"LEFT"', '"left"'),
        "reason": _CASE,
    },
    {
        "function": "taskcustody.deploy.connection.server_version",
        "original": _PROBE,
        "mutated": 'client.lmove(probe, probe, "LEFT")',
        "reason": _ROTATE,
    },
    {
        "function": "taskcustody.deploy.connection.server_version",
        "original": _PROBE,
        "mutated": 'client.lmove(probe, probe, "RIGHT", )',
        "reason": _ROTATE,
    },
    {
        "function": "taskcustody.deploy.connection.check_key_types",
        "original": "pipe = client.pipeline(transaction=False)",
        "mutated": "pipe = client.pipeline(transaction=None)",
        "reason": "redis-py tests `transaction` for truth only: None is False.",
    },
    {
        "function": "taskcustody.deploy.connection.check_key_types",
        "original": _TYPES_ZIP,
        "mutated": _TYPES_ZIP.replace("strict=True", "strict=False"),
        "reason": _ONE_REPLY_EACH,
    },
    {
        "function": "taskcustody.deploy.connection.check_key_types",
        "original": _TYPES_ZIP,
        "mutated": _TYPES_ZIP.replace("strict=True", ""),
        "reason": _ONE_REPLY_EACH,
    },
    {
        "function": "taskcustody.deploy.connection.connect",
        "original": "decode_responses=False,",
        "mutated": "decode_responses=None,",
        "reason": _DECODE,
    },
    {
        "function": "taskcustody.deploy.connection.connect",
        "original": "decode_responses=False,\n    )",
        "mutated": ")",
        "reason": _DECODE + " (False is also redis-py's default)",
    },
    {
        "function": "taskcustody.deploy.connection.connect_fake",
        "original": "fake_server = server if server is not None else fakeredis.FakeServer()",
        "mutated": "fake_server = server if (server is not None) or True "
        "else fakeredis.FakeServer()",
        "reason": "fakeredis (2.41) gives a client made with server=None a FakeServer of its own "
        "(checked: two such clients share no keys), which is what passing a new "
        "FakeServer() does.",
    },
    {
        "function": "taskcustody.deploy.connection.connect_fake",
        "original": _FAKE_CLIENT,
        "mutated": _FAKE_CLIENT.replace("retry=no_retry()", "retry=None"),
        "reason": _FAKE_RETRY,
    },
    {
        "function": "taskcustody.deploy.connection.connect_fake",
        "original": _FAKE_CLIENT,
        "mutated": _FAKE_CLIENT.replace("retry=no_retry()", ""),
        "reason": _FAKE_RETRY,
    },
    # -- server.py -----------------------------------------------------------------------------
    {
        "function": "taskcustody.core.server.Server.claim",
        "original": "if int(incarnation) < 0:",
        "mutated": "if int(incarnation) <= 0:",
        "reason": _INCARNATION,
    },
    {
        "function": "taskcustody.core.server.Server.claim",
        "original": "if int(incarnation) < 0:",
        "mutated": "if int(incarnation) < 1:",
        "reason": _INCARNATION,
    },
    {
        "function": "taskcustody.core.server.Server.claim",
        "original": "self.superseded = False",
        "mutated": "self.superseded = None",
        "reason": "superseded is only tested for truth (`if not self.superseded:`).",
    },
    {
        "function": "taskcustody.core.server.Server._background",
        "original": "waited = 0.0",
        "mutated": "waited = 1.0",
        "reason": "`waited` is only ever compared with `next_sweep`, which starts at 0 and is then "
        "always `waited + sweep_interval`: the first pass sweeps either way (0 >= 0, "
        "1 >= 0) and every later comparison carries the same offset on both sides, so "
        "the sweeps fall on the same passes (the schedule is pinned by tests/"
        "test_server_lifecycle.py::test_background_heartbeats_every_interval_and_"
        "sweeps_on_its_own_period).",
    },
]
