"""What the gateway and the control plane share about traffic, importing neither.

`table`: the route table (model → version by split or alias → endpoint) the control plane
writes and the gateway reads; `stats`: per-version request outcomes the gateway records and the
rollout analysis reads (`VersionHealth`); `sync`: what a gateway process and the control plane
exchange (the table one way, in-flight counts and outcomes the other).
"""
