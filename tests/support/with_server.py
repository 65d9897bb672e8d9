"""Run one command against a throwaway server: `python -m tests.support.with_server -- CMD...`.

Starts the server that the real-Redis tests would start ($TASKCUSTODY_REDIS_SERVER, else
`redis-server` from PATH) on a free port, replaces `{url}` in CMD by its URL, runs CMD, stops the
server by pid and exits with CMD's status. The matrix (.ci/matrix) runs `taskcustody verify
--redis-url {url}` and the below-floor refusal this way, reusing the server management of the
tests instead of a second copy in shell.

With --version-only it prints the version the started server reports (Valkey's own version where
the server is Valkey, whose `redis_version` is a compatibility constant) and runs nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import redis

from tests.support.redis_server import throwaway_redis_server


def reported_version(url: str) -> str:
    """The server's own version: Valkey reports `valkey_version` beside a fixed
    `redis_version` (7.2.4), which is what taskcustody's version check reads."""
    client = redis.Redis.from_url(url, protocol=2)  # see RedisServerProcess._wait_ready
    try:
        info = client.info("server")
    finally:
        client.close()
    if "valkey_version" in info:
        return f"Valkey {info['valkey_version']} (redis_version {info['redis_version']})"
    return f"Redis {info['redis_version']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.with_server")
    parser.add_argument("--version-only", action="store_true")
    parser.add_argument("command", nargs="*", help="run with {url} replaced by the server's URL")
    args = parser.parse_args(argv)
    if not args.version_only and not args.command:
        parser.error("give a command (after --) or --version-only")
    with throwaway_redis_server() as server:
        version = reported_version(server.url)
        if args.version_only:
            print(version)
            return 0
        print(f"== {version} on {server.url} (pid {server.pid})", file=sys.stderr, flush=True)
        command = [part.replace("{url}", server.url) for part in args.command]
        return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
