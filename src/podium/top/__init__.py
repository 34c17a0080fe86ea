"""`podium top`: like `top`, for serving: a live view of instances read from their /metrics."""

from podium.top.cli import register, run

__all__ = ["register", "run"]
