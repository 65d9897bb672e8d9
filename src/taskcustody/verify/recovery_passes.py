"""The harness's recovery passes: a sweep or a startup drain runs whole inside one step, and the
model walks the same pass (every `drain_step`, and for a sweep the processing sweep); a lost reply
can hit any move of it, and the owner of a list being drained may step between two moves."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import redis
from taskcustody_model import (
    Action,
    enabled_actions,
    is_live,
    list_of,
    prune,
    with_process,
)
from taskcustody_model.state import (
    CLAIMED,
    RUNNING,
    ListKey,
    Registration,
)

from ..core import recovery
from .observation import Mismatch, StepRecord
from .stepping_base import Interleave, actor_of
from .worker_steps import WorkerSteps

#: The worker steps that may run between two moves of a drain (by the owner of the list being
#: drained), and how many of them one pass may contain. The bound is what makes a broken drain
#: that loops until the list is empty end in the harness: once the planned steps are spent nothing
#: appends any more, the real drain empties the list, and the model (whose drain stops at the
#: length it read up front) disagrees.
STEPS_DURING_A_DRAIN = ("take", "record", "release")
MAX_STEPS_DURING_A_PASS = 3


class RecoveryPasses(WorkerSteps):
    """Performs a recovery pass on the implementation, and walks it on the model."""

    def _spares_fresh(self, s: int, inc: int, pruned: tuple[Registration | None, ...]) -> bool:
        """Whether a sweep of server `s`'s incarnation `inc` would forget a registered list but
        for its fresh registration (`Bounds.registration_ages`): empty, not its own, its owner
        not live. The sweep where a collection that ignores the age (design 9) forgets what the
        model keeps."""
        held = {k for k, _ in self.state.lists}
        return any(
            k not in held and k[:2] != (s, inc) and not is_live(pruned, k) for k in self.state.fresh
        )

    def _pass(
        self,
        action: Action,
        command: str,
        lost: bool,
        drop_at: int,
        interleave: Interleave | None = None,
    ) -> None:
        """A whole sweep pass or startup drain: the implementation runs it in one call; the
        model walks it (`sweep`/`startup_drain`, every `drain_step`, then for a sweep the
        processing sweep). With `drop_at` = k, the k-th move's reply is lost. With `interleave`,
        the owner of a list being drained may step between two of its moves (module doc)."""
        s, i = action.server, action.proc
        slot = self.procs[s][i]
        server = slot.server
        # The model first: it says how many moves the pass makes, so we know where to drop, and
        # which worker steps run after which move: {(real list key, n-th move of it): steps}.
        queue_before = self.state.queue, self.state.suspects
        me = self.state.processes[s][i]
        pruned = prune(self.state.registry)
        # (with `Bounds.registration_ages` the grace is a tick: fresh registrations are not
        # candidates; else it is 0, and none is fresh)
        gc_candidates = [
            k
            for k in self.state.registered
            if k[:2] != (s, me.inc) and not is_live(pruned, k) and k not in self.state.fresh
        ]
        if command == "sweep" and self._spares_fresh(s, me.inc, pruned):
            self.counts["sweeps-sparing-fresh"] += 1
        self.model_step(action)
        self._order_drains(s, i)
        procs = self.state.processes[s]
        # The length each drain of the pass reads up front: its bound (bounded work).
        bounds = {
            self._real_key(d.key): (d.key, d.length)
            for d in (procs[i].drains if i < len(procs) else ())
        }
        moves = 0
        abandoned = lost
        plan: dict[tuple[str, int], list[Action]] = {}
        moves_of: Counter[ListKey] = Counter()
        budget = MAX_STEPS_DURING_A_PASS if interleave is not None else 0
        while not abandoned:
            procs = self.state.processes[s]
            proc = procs[i] if i < len(procs) else None
            if proc is None or not proc.drains:
                break
            moves += 1
            if moves == drop_at and self._faults_left():
                self.counts["dropped-reply:drain_step"] += 1
                self.model_step(Action("dropped_reply", s, i, -1, "drain_step"))
                abandoned = True
            else:
                key = proc.drains[0].key
                held = len(list_of(self.state, key))
                self.model_step(Action("drain_step", s, i))
                # it moved a task (to the queue, or a poison pill to the dead letters): the hook
                # runs on both sides
                if len(list_of(self.state, key)) < held:
                    moves_of[key] += 1
                    if budget > 0 and interleave is not None:
                        between = self._steps_during_drain(key, interleave, budget)
                        budget -= len(between)
                        if between:
                            plan[(self._real_key(key), moves_of[key])] = between
        # Now the implementation. A sweep's first EVAL is the prune; then, if the registry holds
        # lists of owners that are not live (and old enough), one garbage collection per batch
        # of them; then the drains.
        evals_before = 0
        if command == "sweep":
            evals_before = 1 + -(-len(gc_candidates) // recovery.BATCH)
        if lost:
            self.injector.arm("EVAL", label=slot.label)
        elif abandoned:
            self.injector.arm("EVAL", label=slot.label, skip=evals_before + moves - 1)
        failed = False
        hook_before = recovery.between_drain_chunks
        real_moves: Counter[str] = Counter()  # per list; one move per chunk (`drain_chunk=1`)
        recovery.between_drain_chunks = self._drain_hook(plan, real_moves)
        try:
            if command == "sweep":
                report = server.sweep()
                self.recovered += report.moved + report.requeued_stuck
            else:
                drained = server.startup_drain()
                self.recovered += sum(drained.values())
        except redis.ConnectionError:
            failed = True
        finally:
            recovery.between_drain_chunks = hook_before
            self.injector.disarm_all()
        if failed and not (lost or abandoned):
            raise Mismatch("fault", f"{command} failed with no fault injected")
        if (lost or abandoned) and not failed:
            raise Mismatch(
                "fault",
                f"{command}: the dropped reply did not surface (the pass made "
                "fewer moves than the model predicts)",
            )
        for real_key, n in real_moves.items():
            if real_key in bounds and n > bounds[real_key][1]:
                key, length = bounds[real_key]
                raise Mismatch(
                    "real:bounded-work",
                    f"a drain of inflight:{key[0]}:{key[1]}:{key[2]} made {n} moves; "
                    f"the list held {length} when it started",
                )
        if command == "startup_drain":
            if failed:
                slot.phase = CLAIMED
            else:
                self._start_workers(slot)
        elif not failed:
            # The implementation's sweep ends with the processing sweep; so does the model's walk.
            self.model_step(Action("requeue_stuck_processing_tasks", s, i))
        self._adopt_recovery_order(queue_before)

    def _steps_during_drain(
        self, key: ListKey, interleave: Interleave, budget: int
    ) -> list[Action]:
        """The model's side of the hook, right after a move out of `key`: the worker steps of the
        list's owner that `interleave` picks (at most `budget`), applied to the model."""
        done: list[Action] = []
        while len(done) < budget:
            options = [
                a
                for a in enabled_actions(self.state, self.config)
                if a.name in STEPS_DURING_A_DRAIN
                and (a.server, a.worker) == (key[0], key[2])
                and self.state.processes[a.server][a.proc].inc == key[1]
                # Not a superseded process: its release could make it exit, and renumber the
                # processes in the middle of the pass.
                and self.state.processes[a.server][a.proc].phase == RUNNING
            ]
            if not options:
                break
            chosen = interleave(options)
            if chosen is None:
                break
            self.steps.append(
                StepRecord(
                    len(self.steps) + 1,
                    chosen,
                    f"{self.describe(chosen)} (between two moves of the drain of "
                    f"inflight:{key[0]}:{key[1]}:{key[2]})",
                    False,
                    actor_of(chosen, self.state),
                )
            )
            self.model_step(chosen)
            done.append(chosen)
        self.steps_during_drains += len(done)
        return done

    def _drain_hook(
        self, plan: dict[tuple[str, int], list[Action]], moved: Counter[str]
    ) -> Callable[[str], None]:
        """The implementation's side: `recovery.between_drain_chunks` for one pass, counting the
        moves per list in `moved` and performing the planned worker steps after the n-th move out
        of a list. Steps are planned only for the moves the model makes, so a drain that moves
        more finds nothing more to run there, and ends."""

        def between_drain_chunks(list_key: str) -> None:
            moved[list_key] += 1
            for a in plan.pop((list_key, moved[list_key]), ()):
                self._real_worker_step(a, a.name, False, 0)

        return between_drain_chunks

    def _order_drains(self, s: int, i: int) -> None:
        """The protocol does not fix the order in which a pass drains its lists; the
        implementation goes by sorted key. The model's pass is ordered the same way, so that the
        k-th move (where a dropped reply may hit) is the same task on both sides."""
        procs = self.state.processes[s]
        if i >= len(procs) or len(procs[i].drains) < 2:
            return
        proc = procs[i]
        ordered = tuple(sorted(proc.drains, key=lambda d: self._real_key(d.key)))
        self.state = with_process(self.state, s, i, proc._replace(drains=ordered))

    def _adopt_recovery_order(self, before: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
        """The processing sweep requeues stuck tasks in the order Redis lists the processing
        hash; the model goes by task number. The protocol fixes neither. If one pass requeued
        the same *set* of tasks on both sides, the model adopts the real order of that segment;
        any other difference is left for `check` to report. The same for the suspects list,
        whose recovered tasks are pushed on its left (the queue's on its right)."""
        queue_before, suspects_before = before
        model_q = self.state.queue
        if model_q[: len(queue_before)] == queue_before:
            real_q = self.observe_queue()
            if real_q[: len(queue_before)] == queue_before and sorted(
                real_q[len(queue_before) :]
            ) == sorted(model_q[len(queue_before) :]):
                self.state = self.state._replace(queue=real_q)
        model_s, n = self.state.suspects, len(suspects_before)
        if model_s[len(model_s) - n :] == suspects_before:
            real_s = self.observe_queue(self.keys.suspects)
            if real_s[len(real_s) - n :] == suspects_before and sorted(
                real_s[: len(real_s) - n]
            ) == sorted(model_s[: len(model_s) - n]):
                self.state = self.state._replace(suspects=real_s)
