"""Entry point of the scheduler: ``celery -A signalbox.services.scheduler.worker:app worker -B
-Q scheduler``. The embedded beat is RedBeat, whose Redis lock lets any number of these
run with one beat ticking; the worker side runs the ticks and the store syncs."""

from __future__ import annotations

from celery.signals import worker_ready

from signalbox.shared.celery_app import SCHEDULER_QUEUE, make_celery
from signalbox.shared.gc_freeze import freeze_when_started
from signalbox.shared.log_config import celery_logging
from signalbox.shared.metrics import serve_worker_metrics
from signalbox.shared.redis_clients import redbeat_config
from signalbox.shared.settings import CommonSettings, load
from signalbox.shared.tracing import trace_celery_worker

# The beat wakes at least this often: a one-second interval is kept to the second, and a
# schedule written by the gateway is seen within it.
BEAT_MAX_LOOP_S = 1
# A dead beat's lock expires after this; a standing-by beat then takes over.
BEAT_LOCK_TIMEOUT_S = 10

settings = load(CommonSettings)
celery_logging("scheduler", settings.log_level, settings.log_format)  # the beat's too
app = make_celery("signalbox-scheduler", settings, include=["signalbox.services.scheduler.tasks"])
trace_celery_worker("signalbox-scheduler")
app.conf.task_routes = {**app.conf.task_routes, "scheduler.*": {"queue": SCHEDULER_QUEUE}}
app.conf.update(
    beat_scheduler="signalbox.services.scheduler.beat:SignalboxBeat",
    beat_max_loop_interval=BEAT_MAX_LOOP_S,
    **redbeat_config(settings.redis_url),  # redbeat_redis_url (and Sentinel's options)
    redbeat_key_prefix=f"{settings.redis_prefix}redbeat:",
    redbeat_lock_timeout=BEAT_LOCK_TIMEOUT_S,
)
serve_worker_metrics(app, settings)  # on SIGNALBOX_METRICS_PORT, when set
freeze_when_started(worker_ready, app)  # started: what exists then lives as long as it
