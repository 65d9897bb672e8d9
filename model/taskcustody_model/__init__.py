"""Reference model of the taskcustody protocol and an exhaustive explicit-state checker.

Imports nothing from ``taskcustody`` (the implementation).  Single steps::

    from taskcustody_model import Bounds, Config, initial_state, enabled_actions, apply
    config = Config(Bounds(), variant("correct"))
    state = initial_state(config.bounds)
    for action in enabled_actions(state, config): ...

Besides the checker, the conformance harness (``taskcustody.verify``) drives this model step by
step; what it needs to read a state (``list_of``, ``is_live``, ``prune``, ``renewed``), to edit
one (``with_process``) or to attempt what the model refuses (``refused_attempts``) is exported
here.
"""

from pathlib import Path as _Path

from .checker import CheckResult, Progress, Step, Trace, check
from .invariants import INVARIANTS, check_invariants, check_transition, is_done
from .native import check_fresh as _check_fresh
from .protocol import (
    FAULTS,
    Action,
    Config,
    apply,
    enabled_actions,
    is_live,
    prune,
    renewed,
    with_process,
)
from .refusals import REFUSALS, Attempt, refused_attempts
from .state import Bounds, State, initial_state, list_of
from .variants import VARIANTS, Variant, variant

__all__ = [
    "FAULTS",
    "INVARIANTS",
    "REFUSALS",
    "VARIANTS",
    "Action",
    "Attempt",
    "Bounds",
    "CheckResult",
    "Config",
    "Progress",
    "State",
    "Step",
    "Trace",
    "Variant",
    "apply",
    "check",
    "check_invariants",
    "check_transition",
    "enabled_actions",
    "initial_state",
    "is_done",
    "is_live",
    "list_of",
    "prune",
    "refused_attempts",
    "renewed",
    "variant",
    "with_process",
]

_check_fresh(_Path(__file__).resolve().parent)  # a compiled copy (``native.py``) must be fresh
