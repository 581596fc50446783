"""Benchmarks: Signalbox measured against the bare engine underneath, in one run."""
