"""Signalbox services."""
