"""The ``signalbox`` command: runs every service on one machine, and the admin tools."""
