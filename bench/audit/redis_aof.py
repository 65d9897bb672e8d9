"""A throwaway redis-server with persistence on (appendonly yes, appendfsync always) in a
directory of its own, on 127.0.0.1 and a fixed port, that can be killed and started again on the
same port and files: the "Redis restarted" fault. Stopped by pid.

It is `taskcustody.verify.embedded`'s throwaway server (the tests' and `verify --embedded-redis`'s)
with persistence switched back on: redis-server takes the last of a repeated option."""

from __future__ import annotations

from pathlib import Path

from taskcustody.verify.embedded import RedisServerProcess, free_port


class AofRedis(RedisServerProcess):
    def __init__(self, directory: Path) -> None:
        super().__init__(
            port=free_port(),
            extra_args=(
                "--dir",
                str(directory),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--loglevel",
                "warning",
                "--logfile",
                str(directory / "redis.log"),
            ),
        )
        self.dir = directory

    def start(self, attempts: int = 5) -> AofRedis:
        """Start, or start again on the same port and files after `kill`."""
        self.dir.mkdir(parents=True, exist_ok=True)
        super().start(attempts)
        return self

    def kill(self) -> None:
        """SIGKILL by pid: with appendfsync always, every write Redis acknowledged is on disk."""
        self.stop()
