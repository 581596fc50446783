"""Entry point of the orchestrator: ``celery -A signalbox.services.orchestrator.worker:app worker
-Q orchestrator --pool threads``. Threads, because a turn mostly waits on the model and on
tool results; tool time limits are enforced on the (prefork) tool workers."""

from __future__ import annotations

from celery.signals import worker_ready

from signalbox.services.orchestrator.hooks import load_hooks
from signalbox.services.orchestrator.policy import load_policy
from signalbox.shared.celery_app import make_celery
from signalbox.shared.gc_freeze import freeze_when_started
from signalbox.shared.log_config import celery_logging
from signalbox.shared.metrics import serve_worker_metrics
from signalbox.shared.settings import OrchestratorSettings, load
from signalbox.shared.tracing import trace_celery_worker

settings = load(OrchestratorSettings)
celery_logging("orchestrator", settings.log_level, settings.log_format)
policy = load_policy(settings)  # here, so a broken policy stops the worker before it starts
hooks = load_hooks(settings.hook_modules)  # likewise a hook that does not load
app = make_celery(
    "signalbox-orchestrator", settings, include=["signalbox.services.orchestrator.tasks"]
)
serve_worker_metrics(app, settings)  # on SIGNALBOX_METRICS_PORT, when set
trace_celery_worker("signalbox-orchestrator")
freeze_when_started(worker_ready, app)  # started: what exists then lives as long as it
