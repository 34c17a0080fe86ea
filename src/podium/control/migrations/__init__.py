"""Alembic migrations of the control-plane store, applied in code by `podium.control.store`."""
