"""A Celery worker for tests/shared/test_log_config.py: a task that logs, reports the ids
it runs under and, asked to, sends a second task under them (a second hop)."""

from __future__ import annotations

import logging

from signalbox.shared.celery_app import make_celery
from signalbox.shared.log_config import celery_logging
from signalbox.shared.log_context import current_context, log_context
from signalbox.shared.settings import CommonSettings, load

HOP_QUEUE = "loghop"
REPORT_TASK = "loghop.report"

settings = load(CommonSettings)
celery_logging("loghop", settings.log_level, settings.log_format)
app = make_celery("signalbox-loghop", settings)
app.conf.task_routes = {"loghop.*": {"queue": HOP_QUEUE}}
log = logging.getLogger("tests.loghop")


@app.task(name=REPORT_TASK)
def report(hops: int = 0, call_id: str | None = None) -> dict[str, str]:
    """The ids this task runs under (after ``hops`` more tasks, sent with ``call_id`` added)."""
    log.info("report: %d hop(s) to go", hops)
    if hops:
        with log_context(call_id=call_id):
            # Sent, not waited for here (a task must not block on another's result): the
            # test reads the last hop's result by its id.
            sent = app.send_task(REPORT_TASK, args=[hops - 1], queue=HOP_QUEUE)
        return {"next": sent.id}
    return current_context()
