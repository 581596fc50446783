"""The Celery app Flower watches: ``celery -A signalbox.flower_app:app flower``.

It has the deployment's broker, key prefix and result backend (``shared/celery_app.py``) and
no tasks of its own: Flower learns the tasks from the workers' events (``-E``), so it needs
none of their modules, settings or secrets.
"""

from __future__ import annotations

from signalbox.shared.celery_app import make_celery
from signalbox.shared.settings import CommonSettings, load

app = make_celery("signalbox-flower", load(CommonSettings))
