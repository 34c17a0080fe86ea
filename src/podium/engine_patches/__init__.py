"""Fixes to the pinned engine applied inside its own processes (vLLM general plugins).

Each module names the engine bug it fixes, checks the engine version before it patches, and
leaves another engine version alone."""
