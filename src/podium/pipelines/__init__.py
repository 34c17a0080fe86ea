"""The serving front: pipeline packages (`"backend": "pipeline"`).

Modules: `refs` (references between steps), `steps/` (one module per step kind), `sources/`
(feature sources: sql, plugins), `graph` (parse + check at load), `runner` (one request,
steps concurrent where independent, timeouts, fallbacks, the deadline), `trace` (spans, JSON
records, metrics), `remote` (models behind the gateway), `tensors`, `pipeline` (all of it
for one package), `backend` (the adapter `backends` creates by name, as for Triton models).
"""
