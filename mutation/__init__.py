"""The mutation gate: hand-written named mutants of the protocol's critical lines, and mutmut over
the core modules. Run both with `python -m mutation.gate`; see
docs/development/mutation-gate.md."""
