"""The suspect slot: a server process holds at most one suspect at a time, across its workers.

A *suspect* is a task whose recovery count is >= 1: recovery took it back from a holder that died
and did not dead-letter it. Recovery puts suspects on their own list (`QueueKeys.suspects`), never
back on the queue beside the tasks that died with them. A worker takes a suspect only while its
process holds none (this slot), so a suspect never again shares a process with another counted
task: when a process dies, at most one of the tasks it held was already suspected. That is what
keeps an innocent task that once shared a poison pill's process from being dead-lettered with it
(docs/protocol.md, section 9, invariant suspects-run-alone).

The slot is freed only when the worker that took the suspect is clean again: its release came back
and its list is empty, or its reconcile drained the list. A worker whose take or release reply was
lost keeps the slot until its reconcile, because the suspect may still be in its list.
"""

from __future__ import annotations

import threading


class SuspectSlot:
    """One per server process (every worker of a `Server` shares it); a lone `Worker` has its
    own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: the in-flight list key of the worker that holds the slot: a worker restarted after a
        #: crash is a new object with the same list, and its reconcile frees the slot
        self._holder: str | None = None
        #: whether the suspects list may hold a task, so that a take tries it first: set when a
        #: release reports suspects waiting (every release reads the list's length), when a
        #: blocking take timed out (an idle worker looks at suspects at its next take), and when
        #: this process's own recovery moved something; cleared when a take of a suspect finds
        #: none. It only saves the busy path a round trip: a suspect waits at most one task or one
        #: block timeout for a process to look.
        self.maybe_waiting = False

    def acquire(self, who: str) -> bool:
        with self._lock:
            if self._holder is None:
                self._holder = who
                return True
            return self._holder == who

    def release(self, who: str) -> None:
        with self._lock:
            if self._holder == who:
                self._holder = None

    @property
    def holder(self) -> str | None:
        """The list key of the worker that holds the slot, or None."""
        with self._lock:
            return self._holder

    def held_by(self, who: str) -> bool:
        with self._lock:
            return self._holder == who

    @property
    def free(self) -> bool:
        with self._lock:
            return self._holder is None
