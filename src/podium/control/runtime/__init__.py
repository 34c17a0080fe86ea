"""Runtimes start, watch and stop instances: `local` (processes on this machine)."""
