"""`taskcustody verify`: the model drives the real implementation, with faults injected.

- `faults`: dropped replies injected inside redis-py's connection handling.
- `harness`: the conformance machine's core (`Harness`), shared by the pytest state machine and
  the CLI, made of two parts:
  - `stepping`: set-up, the model's actions on the implementation and on the model, faults and
    recovery passes (what changes Redis), in layers: `stepping_base`, `worker_steps`,
    `recovery_passes`;
  - `observation`: reading Redis back into the model's terms (the mapping), the checks and the
    tallies.
- `machine`: the Hypothesis state machine (`build_machine`), its kinds (`machine_kinds`,
  `refusing`), the drivers' drawn choices (`drawn`) and its counts (`stats`); `seeding`: every run
  draws from an explicit seed, never from the machine's source text; `aiming`: rules that walk
  to a fault kind.
- `run`: one verification run, made of `options`, `result`, `run_redis`, `stateful_run` and
  `parts`.
- `broken`: reference implementations of the designs the checker must reject (demonstrations).
- `report`: the text report and the self-contained HTML page; `protocol_log`: the protocol's own
  log lines during a run (what the injected faults make it log), counted by kind for the report
  and kept off stderr (printed with `verify -v`).
- `cli`: the `taskcustody verify` command.
- `backends`: what a run on fakeredis cannot see, and what covers it on a real server;
  `embedded`: the throwaway redis-server of `--embedded-redis` (and of the tests).
- For users' CI: `budget` (`--max-seconds`), `junit` (`--junit-xml`), `coverage` (what each part
  of a run covered) and `pytest_plugin` (the conformance run as pytest items, loaded through the
  `taskcustody_pytest` entry point).
"""
