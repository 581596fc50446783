"""Tool workers: the registry of tools, their execution with time limits, and the Celery worker."""
