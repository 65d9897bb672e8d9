"""Every error a user can cause, on every CLI command: one line, the right exit code, no traceback.

Table-driven, on real Redis: each case is a throwaway server (or port) in the state that causes
it. Exit 2 for what is wrong without asking Redis (a URL, a name, a payload, a missing flag);
exit 1 for what the server or the keyspace says. "One line": exactly one line of the output starts
with "Error:", it names the case, and the command ended through click (SystemExit), not through
an exception escaping it.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
from click.testing import CliRunner, Result

from taskcustody import ManualClock, QueueKeys, Server
from taskcustody.cli.app import main
from tests.conftest import TEST_SETTINGS
from tests.support.redis_server import (
    RedisServerProcess,
    free_port,
    redis_server_binary,
    throwaway_redis_server,
)

pytestmark = pytest.mark.real_redis

QUEUE = "errs"
KEYS = QueueKeys(QUEUE)


def commands(queue: str = QUEUE) -> dict[str, list[str]]:
    """Every command that talks to Redis, with arguments that are fine in themselves."""
    return {
        "worker": [
            "worker",
            "json:dumps",
            "--queue",
            queue,
            "--server-id",
            "t1",
            "--block-timeout",
            "0.05",
        ],
        "enqueue": ["enqueue", "--queue", queue, '{"a": 1}'],
        "status": ["status", "--queue", queue],
        "sweep": ["sweep", "--queue", queue],
        "dead list": ["dead", "list", "--queue", queue],
        "dead show": ["dead", "show", "some-id", "--queue", queue],
        "dead requeue": ["dead", "requeue", "--all", "--queue", queue],
        "dead purge": ["dead", "purge", "--yes", "--queue", queue],
        "result": ["result", "some-id", "--timeout", "0", "--queue", queue],
    }


def invoke(args: list[str], url: str | None = None) -> Result:
    full = [*args, "--redis-url", url] if url is not None else args
    return CliRunner().invoke(main, full)


def assert_one_line(result: Result, exit_code: int, fragment: str) -> None:
    __tracebackhide__ = True
    out = result.output
    assert "Traceback" not in out, out
    assert isinstance(result.exception, SystemExit), (result.exception, out)
    assert result.exit_code == exit_code, out
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, out
    assert fragment.lower() in errors[0].lower(), out


# -- servers and ports in the state each case needs ------------------------------------------


class _Http(http.server.BaseHTTPRequestHandler):
    """Answers anything with an HTTP/1.1 400, as a web server on the wrong port would."""

    default_request_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def http_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Http)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def cluster_node() -> Iterator[RedisServerProcess]:
    """A Redis Cluster node that serves no slot: every key command answers CLUSTERDOWN."""
    port = free_port()
    while port + 10_000 > 65_535:  # the cluster bus listens on port + 10000
        port = free_port()
    conf = f"taskcustody-test-nodes-{port}.conf"
    node = RedisServerProcess(
        port=port, extra_args=("--cluster-enabled", "yes", "--cluster-config-file", conf)
    )
    try:
        node.start()
        yield node
    finally:
        node.stop()
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join("/tmp", conf))


@dataclass
class Env:
    """The servers of the table, started once for the module."""

    plain: RedisServerProcess
    auth: RedisServerProcess
    replica: RedisServerProcess
    cluster: RedisServerProcess
    http: int

    def url(self, server: RedisServerProcess, db: int = 0, userinfo: str = "") -> str:
        at = f"{userinfo}@" if userinfo else ""
        return f"redis://{at}127.0.0.1:{server.port}/{db}"


@pytest.fixture(scope="module")
def env(real_redis: RedisServerProcess) -> Iterator[Env]:
    if redis_server_binary() is None:
        pytest.skip("no redis-server binary")
    admin = redis.Redis.from_url(real_redis.url)
    admin.acl_setuser(
        "tc-limited",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        commands=["+ping", "+info", "+config|get"],
    )
    with contextlib.ExitStack() as stack:
        auth = stack.enter_context(throwaway_redis_server())
        # Set after start: the helper's readiness check runs INFO without a password.
        redis.Redis(port=auth.port).config_set("requirepass", "s3cret")
        replica = stack.enter_context(
            throwaway_redis_server("--replicaof", "127.0.0.1", str(free_port()))
        )
        cluster = stack.enter_context(cluster_node())
        http = stack.enter_context(http_port())
        yield Env(real_redis, auth, replica, cluster, http)
    admin.acl_deluser("tc-limited")
    admin.close()


class WorkerStarted(Exception):
    """The worker command got past its checks: the case under test raised no error."""


@pytest.fixture(autouse=True)
def worker_never_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker command whose case is not an error would run for ever: make it stop, and fail
    the test, as soon as its server has started."""

    def start_only(
        self: Server,
        until_idle: bool = False,
        install_signals: bool = False,
        wait_for_id: float = 0.0,
    ) -> None:
        workers = self.start(wait_for_id)
        for worker in workers:
            worker.close()
        self.deregister()
        raise WorkerStarted(self.server_id)

    monkeypatch.setattr(Server, "run", start_only)


@pytest.fixture
def plain(env: Env) -> redis.Redis:
    client = redis.Redis.from_url(env.plain.url)
    client.flushall()
    return client


# -- every command x every case the server or the URL causes ---------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    url: Callable[[Env], str]
    exit_code: int
    fragment: str
    prepare: Callable[[redis.Redis], object] = lambda client: None
    # Commands to run it on, when not all: a case that costs a socket timeout per command.
    only: frozenset[str] | None = None


CASES = [
    Case("unreachable", lambda e: f"redis://127.0.0.1:{free_port()}/0", 1, "cannot reach Redis"),
    Case("no-such-host", lambda e: "redis://no-such-host.invalid:6390/0", 1, "cannot reach Redis"),
    Case(
        "unix-socket-missing",
        lambda e: "unix:///nonexistent/taskcustody.sock",
        1,
        "cannot reach Redis",
    ),
    # The TLS handshake waits out the connect timeout (5 s): two commands show the mapping.
    Case(
        "tls-to-plain-port",
        lambda e: f"rediss://127.0.0.1:{e.plain.port}/0",
        1,
        "cannot reach Redis",
        only=frozenset({"enqueue", "status"}),
    ),
    Case(
        "http-port",
        lambda e: f"redis://127.0.0.1:{e.http}/0",
        1,
        "does not speak the Redis protocol",
    ),
    Case("db-index-out-of-range", lambda e: e.url(e.plain, db=99), 1, "has no database 99"),
    Case("no-password", lambda e: e.url(e.auth), 1, "requires a password and the URL gives none"),
    Case("wrong-password", lambda e: e.url(e.auth, userinfo=":nope"), 1, "refused the credentials"),
    Case(
        "acl-no-permission",
        lambda e: e.url(e.plain, userinfo="tc-limited:pw"),
        1,
        "may not run a command",
    ),
    Case("read-only-replica", lambda e: e.url(e.replica), 1, "is a replica"),
    # (A node of a healthy cluster is no error any more: the commands detect the cluster and
    # follow its slot map; `--no-cluster` at the wrong node is tests/test_cluster_*'s case.)
    Case("cluster-down", lambda e: e.url(e.cluster), 1, "Redis Cluster error: "),
    Case(
        "queue-key-is-a-string",
        lambda e: e.plain.url,
        1,
        f"key '{KEYS.queue}' holds a string, but taskcustody needs a list",
        lambda c: c.set(KEYS.queue, "oops"),
    ),
    Case(
        "dead-letters-key-is-a-hash",
        lambda e: e.plain.url,
        1,
        f"key '{KEYS.dead_letters}' holds a hash, but taskcustody needs a list",
        lambda c: c.hset(KEYS.dead_letters, "a", "b"),
    ),
]

# The read-only replica answers reads: only the commands that write meet its refusal, and those
# that only read work there (a replica is a fine place to look).
READS = {"status", "dead list", "dead show", "result"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("command", list(commands()))
def test_every_command_names_what_the_server_or_the_url_says(
    env: Env, plain: redis.Redis, case: Case, command: str
) -> None:
    if case.name == "read-only-replica" and command in READS:
        pytest.skip("reads work on a replica")
    if case.only is not None and command not in case.only:
        pytest.skip(f"{case.name} runs on {sorted(case.only)} only")
    case.prepare(plain)
    result = invoke(commands()[command], case.url(env))
    assert_one_line(result, case.exit_code, case.fragment)


# -- usage errors: found without asking Redis (exit 2) ---------------------------------------


URL_USAGE = [
    ("not-a-redis-scheme", "http://127.0.0.1/0", "--redis-url"),
    ("port-not-a-number", "redis://127.0.0.1:notaport/0", "--redis-url"),
    ("port-out-of-range", "redis://127.0.0.1:70000/0", "--redis-url"),
    ("database-not-a-number", "redis://127.0.0.1:{port}/abc", "is not a number"),
]


@pytest.mark.parametrize(("name", "url", "fragment"), URL_USAGE, ids=[u[0] for u in URL_USAGE])
@pytest.mark.parametrize("command", list(commands()))
def test_every_command_refuses_a_malformed_url_as_usage(
    name: str, url: str, fragment: str, command: str
) -> None:
    result = invoke(commands()[command], url.format(port=free_port()))
    assert_one_line(result, 2, fragment)


@pytest.mark.parametrize("name", ["bad name", "a{b}", "a:b"])
@pytest.mark.parametrize("command", list(commands()))
def test_every_command_refuses_a_queue_name_that_breaks_the_key_schema(
    name: str, command: str
) -> None:
    result = invoke(commands(name)[command], f"redis://127.0.0.1:{free_port()}/0")
    assert_one_line(result, 2, "queue name")


@pytest.mark.parametrize("command", list(commands()))
def test_every_command_refuses_a_prefix_that_breaks_the_key_schema(command: str) -> None:
    result = invoke([*commands()[command], "--prefix", "a b"], f"redis://127.0.0.1:{free_port()}/0")
    assert_one_line(result, 2, "prefix")


USAGE = [
    ("payload-nan", ["enqueue", "--queue", QUEUE, "NaN"], "NaN is not JSON"),
    (
        "payload-infinity",
        ["enqueue", "--queue", QUEUE, '{"x": -Infinity}'],
        "-Infinity is not JSON",
    ),
    ("payload-not-json", ["enqueue", "--queue", QUEUE, "{not json"], "payload 1 is not JSON"),
    (
        "server-id-with-colon",
        ["worker", "json:dumps", "--queue", QUEUE, "--server-id", "host:a"],
        "server id 'host:a' is not allowed",
    ),
    (
        "server-id-with-brace",
        ["worker", "json:dumps", "--queue", QUEUE, "--server-id", "a{b}"],
        "server id 'a{b}' is not allowed",
    ),
    ("handler-not-module-function", ["worker", "nomodule", "--queue", QUEUE], "MODULE:FUNCTION"),
    ("requeue-nothing-named", ["dead", "requeue", "--queue", QUEUE], "name the TASK_IDS"),
    (
        "requeue-ids-and-all",
        ["dead", "requeue", "x", "--all", "--queue", QUEUE],
        "name the TASK_IDS",
    ),
    ("purge-without-yes", ["dead", "purge", "--queue", QUEUE], "add --yes"),
    ("result-negative-timeout", ["result", "x", "--timeout", "-1", "--queue", QUEUE], "--timeout"),
    (
        "result-ttl-negative",
        ["worker", "json:dumps", "--queue", QUEUE, "--result-ttl", "-1"],
        "--result-ttl",
    ),
]


@pytest.mark.parametrize(("name", "args", "fragment"), USAGE, ids=[u[0] for u in USAGE])
def test_misuse_is_one_line_and_exit_2(name: str, args: list[str], fragment: str) -> None:
    result = invoke(args, f"redis://127.0.0.1:{free_port()}/0")
    assert_one_line(result, 2, fragment)


# -- runtime errors of one command -----------------------------------------------------------


def _dead_letter_one(client: redis.Redis) -> str:
    """A task that failed max_attempts times, dead-lettered by a real worker."""
    from taskcustody import Producer

    def fail(payload: object) -> None:
        raise RuntimeError("boom on purpose")

    task_id = Producer(client, KEYS).enqueue({"n": 1})
    (worker,) = Server(
        client, KEYS, "s1", fail, settings=TEST_SETTINGS, clock=ManualClock()
    ).start()
    try:
        for _ in range(TEST_SETTINGS.max_attempts):
            worker.run_once(timeout=0.05)
    finally:
        worker.close()
    return task_id


def test_runtime_errors_of_one_command(env: Env, plain: redis.Redis) -> None:
    url = env.plain.url
    rows: list[tuple[list[str], str]] = [
        (["dead", "show", "nope", "--queue", QUEUE], "no dead letter of task nope"),
        (["dead", "requeue", "nope", "--queue", QUEUE], "no dead letter with id nope in queue"),
        (["result", "nope", "--timeout", "0", "--queue", QUEUE], "no task nope in queue"),
    ]
    for args, fragment in rows:
        assert_one_line(invoke(args, url), 1, fragment)
    failed = _dead_letter_one(plain)
    assert_one_line(
        invoke(["result", failed, "--timeout", "0", "--queue", QUEUE], url),
        1,
        f"task {failed} failed after 3 attempt(s) and was dead-lettered: "
        "RuntimeError: boom on purpose",
    )
    # A live process holds the server id: refused at once with --wait-for-id 0 (a --server-id
    # waits a lease out by default: a restart after a crash).
    holder = Server(
        plain, KEYS, "held", lambda p: None, settings=TEST_SETTINGS, clock=ManualClock(time.time())
    )
    holder.claim()
    assert_one_line(
        invoke(
            ["worker", "json:dumps", "--queue", QUEUE, "--server-id", "held", "--wait-for-id", "0"],
            url,
        ),
        1,
        "held",
    )
    # A result key of the wrong type is named.
    plain.lpush(KEYS.result("odd"), "x")
    assert_one_line(
        invoke(["result", "odd", "--timeout", "0", "--queue", QUEUE], url),
        1,
        f"key '{KEYS.result('odd')}' holds a list, but taskcustody needs a string",
    )


@pytest.mark.parametrize("command", ["worker", "enqueue", "sweep", "dead requeue"])
def test_commands_that_write_refuse_a_redis_older_than_6_2(
    env: Env, plain: redis.Redis, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No Redis < 6.2 binary here: the real server's INFO is made to report 6.0.9.
    real_info = redis.Redis.info

    def old_info(self: redis.Redis, section: str | None = None, *args: object) -> object:
        reply = real_info(self, section, *args)  # type: ignore[arg-type]
        return {**reply, "redis_version": "6.0.9"} if section == "server" else reply

    monkeypatch.setattr(redis.Redis, "info", old_info)
    assert_one_line(
        invoke(commands()[command], env.plain.url),
        1,
        "Redis 6.0.9 found; taskcustody needs Redis 6.2 or newer",
    )
