"""Task events (``-E``, for Flower and ``celery events``) sent in batches, not one by one.

A prefork worker's main process sends three events per task (received, started,
succeeded). Celery buffers them, but flushes the buffer at the event loop's next turn, so
under a stream of quick calls nearly every event goes out as a publish of its own: a Redis
``PUBLISH`` (and a new kombu client object) each, about a third of the main process's CPU
per quick tool call. Flushed at most every ``FLUSH_S`` instead, the events of many calls
leave as one ``task.multi`` message, which ``celery events`` and Flower read as the events
it holds. Nothing else changes: the same events, in the same order, at most ``FLUSH_S``
later (and at once when ``buffer_limit`` of them wait, as before).
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

FLUSH_S = 0.05  # a monitor sees a task's events this much later at most


class BatchedTaskEvents(bootsteps.StartStopStep):
    """A consumer step: the event dispatcher's buffer is flushed on a timer."""

    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._pending = False

    def start(self, parent: Any) -> None:
        """Called at every (re)connection, after ``Events`` made a new dispatcher."""
        dispatcher = getattr(parent, "event_dispatcher", None)
        hub = getattr(parent, "hub", None)
        if dispatcher is None or hub is None or not dispatcher.on_send_buffered:
            return  # no event loop (not prefork), or nothing buffered: Celery's own way
        self._pending = False

        def flush() -> None:
            self._pending = False
            parent._flush_events()

        def later() -> None:
            if not self._pending:
                self._pending = True
                hub.call_later(FLUSH_S, flush)

        dispatcher.on_send_buffered = later

    def stop(self, parent: Any) -> None:
        """The events still buffered go out before the dispatcher closes."""
        dispatcher = getattr(parent, "event_dispatcher", None)
        if dispatcher is not None and self._pending:
            dispatcher.flush()
