"""The proposals service: file changes agents propose, applied once a human approves."""
