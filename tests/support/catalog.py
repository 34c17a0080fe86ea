"""A deterministic catalog of realistic-looking titles, for tests."""

from __future__ import annotations

import itertools

_ADJ = ["Silent", "Crimson", "Last", "Hidden", "Broken", "Golden", "Midnight", "Frozen",
        "Wild", "Lost", "Electric", "Burning", "Distant", "Secret", "Iron", "Paper",
        "Velvet", "Hollow", "Bright", "Savage"]
_NOUN = ["River", "Empire", "Garden", "Signal", "Harbor", "Kingdom", "Mirror", "Orbit",
         "Station", "Winter", "Forest", "Machine", "Theory", "Island", "Shadow", "Echo",
         "Frontier", "Letter", "Circus", "Horizon"]
_TAIL = ["", " Returns", " Rising", ": Part II", " of Tomorrow", " Chronicles", " 2049",
         " in Paris", " Forever", " Unbound", " Reloaded", " at Dawn", " Legacy", " Saga",
         " Files", " of the North", " Diaries", " Protocol", " Story", " Nights",
         " (Director's Cut)", " Redux", " Begins", " Ends", " Again"]


def make_titles(n: int) -> list[str]:
    """``n`` distinct, realistic-looking catalog titles (deterministic)."""
    titles = [f"The {a} {b}{t}" if i % 2 else f"{a} {b}{t}"
              for i, (t, a, b) in enumerate(itertools.product(_TAIL, _ADJ, _NOUN))]
    titles += [f"{t} {k}" for k in range(2, 100) for t in titles[:2000]]
    assert len(titles) >= n
    return titles[:n]
