"""Reviewed equivalent mutmut mutants: a mutant listed here cannot change any behaviour the
protocol or its users can observe, for the reason given.

Each entry is matched on the function, the original line and the exact mutated line (whitespace
at the ends ignored). The mutmut key is informational: numbers shift when a function changes.
When either line changes, the entry stops matching, the mutant counts as a survivor again, and the
gate fails until someone reviews it afresh (and the stale entry is reported, to be deleted).
"""

from __future__ import annotations

EQUIVALENTS: list[dict[str, str]] = []
