"""Metrics made when this module is imported. A zygote that imports it
(tests/preload/test_zygote.py) holds values made before any instance forks from it, as it holds
Podium's server metrics and vLLM's (`podium:ready`, `podium:event_loop_lag_seconds`); an
instance then makes labelled values of its own beside them (`zygote_child.py metrics`)."""

from __future__ import annotations

from prometheus_client import Counter

MADE_AT_IMPORT = Counter(
    "zygote_made_at_import",
    "A counter made when the zygote imported this module; its help is longer than the "
    "labelled counter's so that its entry in the file and theirs differ in length.")
LABELLED = Counter("zygote_labelled", "labelled", ("code",))
