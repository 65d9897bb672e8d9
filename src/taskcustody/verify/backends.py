"""What `taskcustody verify` on fakeredis cannot see, and what covers it on a real server.

The default stateful run is on fakeredis, in-process (nothing to install). Most of what the run
catches it catches there too: dropped replies are injected in the client's connection class on
both backends (faults.py), the model's Redis wipe flushes the script cache on fakeredis as on a
server of the run's own (stepping.py), and the workers take with BLMOVE, as in production, on
fakeredis too (its connections are the fault injector's, so `is_fakeredis` is False and the
BRPOPLPUSH workaround is not used: the run's takes never wait on an empty queue, where
fakeredis's BLMOVE falls short). `tests/test_verify_backends_agree.py` runs broken designs on
both and asserts that both catch them.

Some classes of bug only a real server shows. `REAL_SERVER_ONLY` lists them, one row each: why
fakeredis misses it, whether the stateful run covers it on a real server (`--redis-url URL` or
`--embedded-redis`), and which tests cover it on a real server (`path::test`, checked to exist
by tests/test_verify_backends_agree.py). The report of a fakeredis run prints the list with how
to cover it (`report.blind_spots`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RealServerOnly:
    """One class of bug that only a real server shows."""

    name: str  # short, for the report
    what: str  # the class of bug
    why: str  # why fakeredis cannot show it
    #: True: the stateful run catches it on a real server (`--embedded-redis`, `--redis-url`);
    #: False: only the tests below do, the run's machine does not reach it
    in_verify: bool
    tests: tuple[str, ...]  # tests that cover it on a real server (path::test function)


REAL_SERVER_ONLY: tuple[RealServerOnly, ...] = (
    RealServerOnly(
        "transport retries",
        "a client library that sends a command again after a broken connection (redis-py's "
        "Retry): a take or a drain whose reply was lost runs twice",
        "in the stateful part, fakeredis ignores the client's retry setting: a dropped reply "
        "is never sent again (the production-loops part, whose drops are injected as the loop "
        "sends, can see a retried take on fakeredis too)",
        True,
        (
            "tests/test_verify_backends_agree.py::"
            "test_transport_retries_are_caught_on_a_real_server_only",
        ),
    ),
    RealServerOnly(
        "blocking takes and socket timeouts",
        "a take blocked on an empty queue, and the socket timeout that must end it when the "
        "server stops answering (SIGSTOP, CLIENT PAUSE)",
        "fakeredis ignores socket timeouts and CLIENT PAUSE; the stateful run's takes never "
        "wait on an empty queue",
        False,
        (
            "tests/test_real_redis_faults.py::"
            "test_take_on_an_unresponsive_server_raises_instead_of_hanging",
        ),
    ),
    RealServerOnly(
        "server kills and restarts",
        "a server killed and restarted: connections reset by the server, scripts and keys gone",
        "fakeredis has no socket to break; the run's Redis wipe closes connections on the "
        "client's side only",
        False,
        (
            "tests/test_real_redis_faults.py::"
            "test_killed_redis_surfaces_as_an_error_and_the_worker_recovers_after_restart",
            "tests/test_redis_restart_e2e.py::"
            "test_a_task_in_flight_across_the_restart_is_lost_and_every_later_one_commits_exactly_"
            "once",
        ),
    ),
    RealServerOnly(
        "out of memory",
        "maxmemory reached: Redis refuses growing writes (OOM) and the worker must wait it out",
        "fakeredis has no maxmemory",
        False,
        (
            "tests/test_oom.py::"
            "test_over_maxmemory_redis_refuses_our_growing_steps_whole_and_runs_the_release",
            "tests/test_oom.py::"
            "test_a_running_server_rides_out_oom_and_finishes_the_work_once_memory_frees",
        ),
    ),
    RealServerOnly(
        "eviction policy",
        "an allkeys-* eviction policy that may delete a task in custody",
        "fakeredis evicts nothing and has no INFO to read a policy from",
        False,
        (
            "tests/test_eviction.py::"
            "test_an_allkeys_policy_is_refused_naming_the_policy_and_the_fix",
        ),
    ),
    RealServerOnly(
        "replication",
        "a write acknowledged by the primary but not by a replica (Settings.min_replicas, WAIT)",
        "fakeredis has no replicas and no WAIT; min_replicas is refused on it",
        False,
        (
            "tests/test_replication.py::"
            "test_a_worker_whose_replica_is_stopped_commits_every_task_once_and_warns_once",
        ),
    ),
    RealServerOnly(
        "Redis Cluster",
        "a Redis Cluster: MOVED and ASK redirects, failover, a slot migrating",
        "fakeredis is one node",
        False,
        (
            "tests/test_cluster_redirects.py::"
            "test_a_release_refused_by_a_failover_is_sent_to_the_new_master_and_commits_once",
            "tests/test_cluster_end_to_end.py::"
            "test_verify_passes_on_the_cluster_for_a_tag_on_each_master",
        ),
    ),
    RealServerOnly(
        "server version",
        "a server older than Redis 6.2, which lacks commands the protocol needs",
        "fakeredis implements every command whatever version it says",
        False,
        (
            "tests/test_server_below_the_floor.py::"
            "test_the_library_refuses_the_server_naming_its_version",
        ),
    ),
)


def how_to_cover(binary: str | None) -> str:
    """What to run to cover the rows the stateful run reaches, given the redis-server found on
    PATH (or $TASKCUSTODY_REDIS_SERVER; None: there is none)."""
    if binary is not None:
        return (
            f"rerun with --embedded-redis (a throwaway {binary}), or --redis-url URL "
            "(your own Redis)"
        )
    return (
        "rerun with --redis-url URL (your own Redis), or install redis-server and rerun "
        "with --embedded-redis"
    )


#: How the repository's real-server tests run (they start throwaway servers of their own).
REAL_SERVER_TESTS = "python -m pytest -m real_redis"
