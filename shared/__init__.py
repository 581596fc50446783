"""Contracts and plumbing shared by every Signalbox service. Never run on its own."""
