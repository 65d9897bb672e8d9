"""Reference model of the taskcustody protocol and an exhaustive explicit-state checker.

Imports nothing from ``taskcustody`` (the implementation).  Single steps::

    from taskcustody_model import Bounds, Config, initial_state, enabled_actions, apply
    config = Config(Bounds(), variant("correct"))
    state = initial_state(config.bounds)
    for action in enabled_actions(state, config): ...
"""

from .checker import CheckResult, Progress, Step, Trace, check
from .invariants import INVARIANTS, check_invariants, check_transition, is_done
from .protocol import FAULTS, Action, Config, apply, enabled_actions
from .state import Bounds, State, initial_state
from .variants import VARIANTS, Variant, variant

__all__ = [
    "FAULTS",
    "INVARIANTS",
    "VARIANTS",
    "Action",
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
    "variant",
]
