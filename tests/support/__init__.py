"""Helpers shared by the test modules (which never import each other)."""
