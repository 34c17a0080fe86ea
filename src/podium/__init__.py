"""Podium: a self-hosted serving platform for LLMs and classic ML models.

Importing podium is cheap: torch, vLLM and the classic ML libraries load only when a model
that needs them is loaded.
"""

from podium.engine import ENGINE_VERSION

__version__ = "0.1.0"
__all__ = ["ENGINE_VERSION", "__version__"]
