"""`taskcustody verify --async`: the model drives the asyncio worker step by step (verify/aio.py),
with dropped replies injected inside redis.asyncio's connections and steps cancelled with their
reply in flight or before their command is sent (the model's `cancel_before_send`), and the same
refinement check after every step. The correct design verifies on
both backends; the named mutants (mutation/named.py) show that the run catches a broken one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from taskcustody.cli.app import main
from taskcustody.verify import faults
from taskcustody.verify.run import PASSED, Options, verify
from tests.support.redis_server import RedisServerProcess

#: Enough examples for the seeded run to drop and cancel the replies of takes and releases, and to
#: cancel both before their send, few enough for CI. The asyncio machine has no aiming rule: a
#: release's reply cancelled in flight is rare, and the default seed's examples have none; seed
#: 1's have every kind.
EXAMPLES = 120
SEED = 1
#: The same for the prefetching worker's pipelines: a lost reply in a take and in a release
#: pipeline.
PREFETCH_EXAMPLES = 80


def _asyncio_run(url: str | None = None) -> dict[str, int]:
    result = verify(
        Options(
            examples=EXAMPLES,
            steps=40,
            model_check=False,
            asyncio=True,
            redis_url=url,
            embedded=url is not None,
            seed=SEED,
        )
    )
    assert result.failure is None, result.failure
    assert [p.outcome for p in result.parts] == [PASSED]
    assert "asyncio worker" in result.parts[0].name
    assert result.stats is not None
    return dict(result.stats.faults)


def _assert_faulted(counts: dict[str, int]) -> None:
    for kind in (
        "dropped-reply:take",
        "dropped-reply:release",
        "cancelled-in-flight:take",
        "cancelled-in-flight:release",
        "cancelled-before-send:take",
        "cancelled-before-send:release",
    ):
        assert counts.get(kind, 0) > 0, (kind, counts)


def test_verify_async_verifies_the_correct_design_on_fakeredis() -> None:
    _assert_faulted(_asyncio_run())


def test_verify_async_verifies_the_correct_design_on_a_real_server(
    real_redis: RedisServerProcess,
) -> None:
    redis.Redis.from_url(real_redis.url).flushall()
    _assert_faulted(_asyncio_run(real_redis.url))


def _asyncio_prefetching_run(url: str | None = None) -> dict[str, int]:
    result = verify(
        Options(
            examples=PREFETCH_EXAMPLES,
            steps=40,
            model_check=False,
            asyncio=True,
            prefetch=True,
            redis_url=url,
            embedded=url is not None,
        )
    )
    assert result.failure is None, result.failure
    assert [p.outcome for p in result.parts] == [PASSED]
    assert "with the prefetching worker with the asyncio worker" in result.parts[0].name
    assert result.stats is not None
    counts = dict(result.stats.faults)
    # the asyncio prefetching worker's pipelines lost replies at some slot
    for kind in ("dropped-reply:prefetching-take", "dropped-reply:prefetching-release"):
        assert counts.get(kind, 0) > 0, (kind, counts)
    return counts


def test_verify_async_prefetch_drives_the_asyncio_prefetching_worker_on_fakeredis() -> None:
    _asyncio_prefetching_run()


def test_verify_async_prefetch_drives_the_asyncio_prefetching_worker_on_a_real_server(
    real_redis: RedisServerProcess,
) -> None:
    redis.Redis.from_url(real_redis.url).flushall()
    _asyncio_prefetching_run(real_redis.url)


def test_a_cancel_arm_cancels_the_awaiting_task_after_redis_ran_the_command() -> None:
    import fakeredis.aioredis

    async def scenario() -> tuple[bool, bytes | None]:
        injector = faults.FaultInjector()
        client = await faults.install_async(fakeredis.aioredis.FakeRedis(), injector, "x")
        injector.arm("SET", label="x", cancel=True)
        cancelled = False
        try:
            await asyncio.ensure_future(client.set("k", b"v"))
        except asyncio.CancelledError:
            cancelled = True
        value = await client.get("k")
        await client.connection_pool.disconnect()
        return cancelled, value

    cancelled, value = asyncio.run(scenario())
    assert cancelled and value == b"v"


def test_run_without_loop_refuses_a_coroutine_that_suspends() -> None:
    with pytest.raises(RuntimeError, match="suspended"):
        faults.run_without_loop(asyncio.sleep(0))


def test_verify_async_reports_its_part_in_the_text_and_the_junit_xml(tmp_path: Path) -> None:
    junit = tmp_path / "verify.xml"
    out = CliRunner().invoke(
        main,
        [
            "verify",
            "--async",
            "--no-model-check",
            "--quiet",
            "--examples",
            "3",
            "--junit-xml",
            str(junit),
        ],
    )
    assert out.exit_code == 0, out.output
    assert "(with the asyncio worker)" in out.output
    assert "stateful conformance on fakeredis with the asyncio worker PASSED" in out.output
    assert 'name="stateful conformance on fakeredis with the asyncio worker"' in junit.read_text()
    # The production loops and the fault coverage drive the threaded worker: not run here.
    assert junit.read_text().count("<testcase ") == 1


def test_verify_async_with_loops_asked_for_is_refused_in_one_line() -> None:
    out = CliRunner().invoke(main, ["verify", "--async", "--loops"])
    assert out.exit_code == 2
    assert "--loops" in out.output and "Traceback" not in out.output


def test_verify_async_with_a_broken_design_is_refused_in_one_line() -> None:
    out = CliRunner().invoke(main, ["verify", "--async", "--variant", "blpop-take"])
    assert out.exit_code == 2
    assert "--variant" in out.output and "Traceback" not in out.output
