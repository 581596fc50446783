"""Tests of services/proposals."""
