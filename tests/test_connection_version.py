"""How the server's version is found (INFO, or an LMOVE probe where INFO is missing), and what
the checks before any work make of it."""

from __future__ import annotations

import re
from typing import Any

import fakeredis
import pytest
import redis
from click.testing import CliRunner

from taskcustody import (
    QueueKeys,
    RedisTooOld,
    Settings,
    WrongKeyType,
    check_server,
    connect,
    connect_fake,
)
from taskcustody.cli.app import main
from taskcustody.deploy.connection import (
    MIN_VERSION,
    check_key_types,
    parse_version,
    server_version,
)
from tests.conftest import Backend
from tests.support.pre_hello_server import pre_hello_server


class StubClient:
    """Answers INFO as scripted, and LMOVE as Redis 6.2 would (or as an older server, with an
    unknown-command error), recording what it was asked and which keys LMOVE touched."""

    def __init__(self, info: dict[str, Any] | Exception, lmove: Exception | None = None) -> None:
        self._info = info
        self._lmove = lmove
        self.calls: list[tuple[Any, ...]] = []
        self.touched: set[str] = set()

    def info(self, section: str | None = None) -> dict[str, Any]:
        self.calls.append(("info", section))
        if isinstance(self._info, Exception):
            raise self._info
        return self._info

    # redis-py's signature, defaults included.
    def lmove(
        self, first_list: str, second_list: str, src: str = "LEFT", dest: str = "RIGHT"
    ) -> None:
        self.calls.append(("lmove", first_list, second_list, src, dest))
        if self._lmove is not None:
            raise self._lmove
        if {src.upper(), dest.upper()} - {"LEFT", "RIGHT"}:
            raise redis.ResponseError("syntax error")
        self.touched |= {first_list, second_list}


def test_version_comes_from_the_server_section_of_info() -> None:
    stub = StubClient({"redis_version": "7.2.4", "redis_mode": "standalone"})
    assert server_version(stub) == "7.2.4"  # type: ignore[arg-type]
    # One section, not the whole INFO (section names are case-insensitive in Redis).
    assert [(kind, str(section).lower()) for kind, section in stub.calls] == [("info", "server")]


def test_info_without_a_version_is_unknown() -> None:
    stub = StubClient({})
    assert server_version(stub) == "unknown"  # type: ignore[arg-type]


def test_without_info_an_lmove_probe_decides() -> None:
    stub = StubClient(redis.ResponseError("unknown command 'info'"))
    assert server_version(stub) == "unknown (no INFO; LMOVE present)"  # type: ignore[arg-type]
    assert [c[0] for c in stub.calls] == ["info", "lmove"]
    # A rotation of one private key onto itself: it touches no key anyone else uses.
    (probe,) = stub.touched
    assert probe.startswith("__taskcustody")


def test_without_info_or_lmove_the_server_is_too_old() -> None:
    missing = redis.ResponseError("unknown command 'lmove'")
    stub = StubClient(redis.ResponseError("unknown command 'info'"), lmove=missing)
    with pytest.raises(RedisTooOld) as caught:
        server_version(stub)  # type: ignore[arg-type]
    assert str(caught.value) == ("this server has no LMOVE (Redis < 6.2?): unknown command 'lmove'")
    assert caught.value.__cause__ is missing


def test_other_info_failures_are_not_mistaken_for_a_missing_info() -> None:
    stub = StubClient(redis.ConnectionError("refused"))
    with pytest.raises(redis.ConnectionError):
        server_version(stub)  # type: ignore[arg-type]
    assert [kind for kind, *_ in stub.calls] == ["info"]  # no probe: the error propagates


def test_fakeredis_has_no_info_but_passes_the_probe(keys: QueueKeys) -> None:
    client = connect_fake(fakeredis.FakeServer())
    assert server_version(client) == "unknown (no INFO; LMOVE present)"
    assert check_server(client, keys) == "unknown (no INFO; LMOVE present)"
    assert client.dbsize() == 0  # the probe left nothing behind


def test_real_redis_reports_its_version(backend: Backend, keys: QueueKeys) -> None:
    client = backend.client()
    version = check_server(client, keys)
    if backend.real:
        assert version == client.info("server")["redis_version"]
        assert parse_version(version) >= MIN_VERSION
    else:
        assert version.startswith("unknown")


@pytest.mark.parametrize(
    ("version", "refused"),
    [
        ("6.0.20", True),
        ("6.2.0", False),
        ("6.2.14", False),
        ("7.0.0-rc1", False),
        ("5", True),
    ],
)
def test_check_server_refuses_only_versions_below_6_2(
    keys: QueueKeys, version: str, refused: bool
) -> None:
    client = connect_fake(fakeredis.FakeServer())
    client.info = lambda *a, **k: {"redis_version": version}  # type: ignore[method-assign]
    if refused:
        with pytest.raises(
            RedisTooOld,
            match=(
                rf"^Redis {version} found; taskcustody needs Redis 6\.2 or newer for BLMOVE "
                r"and LMOVE$"
            ),
        ):
            check_server(client, keys)
    else:
        assert check_server(client, keys) == version


def test_an_unknown_version_skips_the_version_check(keys: QueueKeys) -> None:
    client = connect_fake(fakeredis.FakeServer())
    client.info = lambda *a, **k: {}  # type: ignore[method-assign]
    assert check_server(client, keys) == "unknown"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("7.2.4", (7, 2, 4)),
        ("7.2.4.1", (7, 2, 4)),
        ("6.2.x", (6, 2, 0)),
        ("v6.2.14", (6, 2, 14)),
    ],
)
def test_parse_version_reads_at_most_three_numeric_parts(
    text: str, parsed: tuple[int, ...]
) -> None:
    assert parse_version(text) == parsed


def test_key_types_are_checked_on_a_client_that_decodes_replies(keys: QueueKeys) -> None:
    """A client made with decode_responses=True answers TYPE with str, not bytes."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    check_key_types(client, keys)  # an empty keyspace is fine
    client.rpush(keys.queue, "t")
    check_key_types(client, keys)  # the right type is fine
    client.delete(keys.queue)
    client.set(keys.queue, "oops")
    with pytest.raises(WrongKeyType, match=r"holds a string, but taskcustody needs a list"):
        check_key_types(client, keys)


def test_connect_makes_clients_that_never_retry_and_time_out_after_the_block() -> None:
    settings = Settings(block_timeout=1.5, socket_timeout_margin=2.0)
    client = connect("redis://127.0.0.1:1/0", settings)  # no connection is made here
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 3.5
    retry = client.get_retry()
    assert retry is not None and retry.get_retries() == 0
    default = connect("redis://127.0.0.1:1/0").connection_pool.connection_kwargs
    assert default["socket_timeout"] == default["socket_connect_timeout"] == 5.0  # 2 + 3


# A server older than 6.0 has no HELLO, which redis-py 8 sends on connecting: INFO then fails
# with "unknown command HELLO". The refusal must still name the version, not that error (the
# worker used to say "no LMOVE: unknown command HELLO", status printed a traceback).
OLD_REFUSAL = (
    r"Redis 5\.0\.6 found; taskcustody needs Redis 6\.2 or newer for BLMOVE and "
    r"LMOVE"
)


def test_a_server_without_hello_is_refused_naming_its_version(keys: QueueKeys) -> None:
    with pre_hello_server("5.0.6") as url, pytest.raises(RedisTooOld, match=rf"^{OLD_REFUSAL}$"):
        check_server(connect(url), keys)


@pytest.mark.parametrize(
    ("args", "exit_code"),
    [
        (["status", "--queue", "q"], 1),
        (["sweep", "--queue", "q"], 1),
        (["enqueue", "--queue", "q", "{}"], 1),
        # verify's exit 1 means "a property was violated"; a server it cannot use is exit 2.
        (["verify", "--no-model-check", "--examples", "1", "--quiet"], 2),
    ],
    ids=["status", "sweep", "enqueue", "verify"],
)
def test_commands_refuse_a_server_without_hello_naming_its_version(
    args: list[str], exit_code: int
) -> None:
    with pre_hello_server("5.0.6") as url:
        result = CliRunner().invoke(main, [*args, "--redis-url", url])
    assert result.exit_code == exit_code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert len(re.findall(OLD_REFUSAL, result.output)) == 1
