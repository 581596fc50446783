"""OpenTelemetry traces: off unless an exporter is configured, then one call per process.

``configure_tracing(service_name)`` runs at every entry point (the two FastAPI apps' ``main``,
each Celery worker process: ``worker_init`` for the threads pool, ``worker_process_init`` in
each prefork child, after the fork). It does nothing, and costs nothing beyond the API's
no-op spans, unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) or
``OTEL_TRACES_EXPORTER`` is set. Then it installs the SDK's tracer provider with a
``BatchSpanProcessor`` and the instrumentations (Celery, httpx; Redis only with
``SIGNALBOX_TRACE_REDIS=true``, SQLAlchemy only with ``SIGNALBOX_TRACE_SQL=true`` and its
package installed: a span per command costs a quarter more CPU per turn under load,
docs/benchmarks.md), and leaves every other ``OTEL_*``
variable to the SDK itself: the sampler, resource attributes, the exporter's headers,
timeout and compression, the batch sizes. ``shutdown_tracing()`` flushes what is queued
(worker shutdown, app shutdown).

Redis and SQL spans are kept only under another span (``ChildOnlyTracerProvider``): the
polling of background threads (leases, reconcilers, Celery's own consumer) would otherwise
make a one-span trace of every command. The spans the instrumentations cannot name (a turn,
a model request, a tool call, a proposal decision) are made with ``tracer`` by their modules.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from fastapi.telemetry import TelemetryConfig
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.util.types import Attributes

log = logging.getLogger(__name__)

# The instrumentation scope of every hand-made span of Signalbox.
tracer = trace.get_tracer("signalbox")

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
TRACE_SQL_VAR = "SIGNALBOX_TRACE_SQL"  # SQL spans: off by default (docs/benchmarks.md, cost)
TRACE_REDIS_VAR = "SIGNALBOX_TRACE_REDIS"  # Redis spans: off by default, for the same reason
# The standard list of instrumentations not to load (as ``opentelemetry-instrument`` reads it).
DISABLED_VAR = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"
# FastAPI's own telemetry skips these paths: probes and scrapes are noise, and a WebSocket
# connection would make one trace of every turn sent over it (a turn is its own trace).
UNTRACED_PATHS = frozenset({"/ws", "/healthz", "/readyz", "/metrics"})

_provider: Any = None  # the SDK's TracerProvider this process installed, if any
_pid: int | None = None


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def tracing_wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces: an OTLP endpoint or a traces exporter set,
    and the SDK not disabled (``OTEL_SDK_DISABLED``, ``OTEL_TRACES_EXPORTER=none``)."""
    env = os.environ if env is None else env
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(exporter) or any(env.get(name, "").strip() for name in ENDPOINT_VARS)


def tracing_on() -> bool:
    """True once ``configure_tracing`` installed the SDK in this process."""
    return _provider is not None and _pid == os.getpid()


def configure_tracing(service_name: str) -> bool:
    """Install the SDK and the instrumentations if the environment asks for traces.

    ``service_name`` is the default ``service.name``; ``OTEL_SERVICE_NAME`` (or
    ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``) wins. Once per process: a second
    call does nothing. True if tracing is on.
    """
    global _provider, _pid
    if tracing_on():
        return True
    if not tracing_wanted():
        return False
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "traces are asked for (OTEL_*) but the SDK is not installed: "
            "pip install 'signalbox[tracing]'; running without traces"
        )
        return False
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if not _service_name_set():
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(_exporter()))
    trace.set_tracer_provider(provider)
    _provider, _pid = provider, os.getpid()
    _instrument(provider)
    log.info("traces on: service %s", provider.resource.attributes.get(SERVICE_NAME))
    return True


def shutdown_tracing() -> None:
    """Export what is still queued and stop the exporter (a no-op when tracing is off)."""
    if tracing_on():
        _provider.shutdown()


def _service_name_set() -> bool:
    if os.environ.get("OTEL_SERVICE_NAME", "").strip():
        return True
    attrs = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    return any(pair.strip().startswith("service.name=") for pair in attrs.split(","))


def _exporter() -> Any:
    """The span exporter ``OTEL_TRACES_EXPORTER`` names (default ``otlp``), over the
    protocol ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` names (default ``http/protobuf``)."""
    name = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise ValueError(
            f"OTEL_TRACES_EXPORTER: expected 'otlp', 'console' or 'none', got {name!r}"
        )
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            raise ValueError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                "installed; or use http/protobuf"
            ) from None
        return GrpcExporter()
    if protocol != "http/protobuf":
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: expected 'http/protobuf' or 'grpc', got {protocol!r}"
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout, compression: from OTEL_*


def _instrument(provider: Any) -> None:
    """Load the instrumentations this process has, less those the environment turns off."""
    disabled = {n.strip() for n in os.environ.get(DISABLED_VAR, "").split(",") if n.strip()}
    child_only = ChildOnlyTracerProvider(provider)
    loaders: dict[str, Any] = {
        "celery": lambda: _load("celery", "CeleryInstrumentor", tracer_provider=provider),
        "httpx": lambda: _load("httpx", "HTTPXClientInstrumentor", tracer_provider=provider),
    }
    if _truthy(os.environ.get(TRACE_REDIS_VAR)):
        loaders["redis"] = lambda: _load("redis", "RedisInstrumentor", tracer_provider=child_only)
    if _truthy(os.environ.get(TRACE_SQL_VAR)):
        loaders["sqlalchemy"] = lambda: _load(
            "sqlalchemy", "SQLAlchemyInstrumentor", tracer_provider=child_only
        )
    for name, load in loaders.items():
        if name not in disabled:
            load()


def _load(module: str, cls: str, **kwargs: Any) -> None:
    import importlib

    try:
        found = importlib.import_module(f"opentelemetry.instrumentation.{module}")
    except ImportError:
        log.info("no %s instrumentation installed: no %s spans", module, module)
        return
    instrumentor = getattr(found, cls)()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(**kwargs)


class ChildOnlyTracerProvider(trace.TracerProvider):
    """A provider whose tracers start a span only under another one (else a no-op span):
    for the Redis and SQL instrumentations, whose root spans are background polling."""

    def __init__(self, inner: trace.TracerProvider) -> None:
        self.inner = inner

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> trace.Tracer:
        return _ChildOnlyTracer(
            self.inner.get_tracer(
                instrumenting_module_name, instrumenting_library_version, schema_url, attributes
            )
        )


class _ChildOnlyTracer(trace.Tracer):
    def __init__(self, inner: trace.Tracer) -> None:
        self.inner = inner

    def start_span(
        self, name: str, context: otel_context.Context | None = None, *args: Any, **kwargs: Any
    ) -> Span:
        if not trace.get_current_span(context).get_span_context().is_valid:
            return trace.INVALID_SPAN
        return self.inner.start_span(name, context, *args, **kwargs)

    @contextlib.contextmanager
    def start_as_current_span(  # type: ignore[override]
        self, name: str, context: otel_context.Context | None = None, *args: Any, **kwargs: Any
    ) -> Iterator[Span]:
        if not trace.get_current_span(context).get_span_context().is_valid:
            yield trace.INVALID_SPAN
            return
        with self.inner.start_as_current_span(name, context, *args, **kwargs) as span:
            yield span


def trace_celery_worker(service_name: str) -> None:
    """Configure tracing in each process of a Celery worker that runs tasks: the main
    process of a threads or solo pool (``worker_init``), each child of a prefork pool after
    its fork (``worker_process_init``: the exporter's thread and sockets must be its own).
    Queued spans are flushed at ``worker_shutdown`` / ``worker_process_shutdown``."""
    from celery.signals import (
        worker_init,
        worker_process_init,
        worker_process_shutdown,
        worker_shutdown,
    )

    def in_main(sender: Any = None, **_: Any) -> None:
        pool = getattr(sender, "pool_cls", "prefork")
        name = pool if isinstance(pool, str) else f"{pool.__module__}.{pool.__name__}"
        if "prefork" not in name.lower():
            configure_tracing(service_name)

    def in_child(**_: Any) -> None:
        configure_tracing(service_name)

    def flush(**_: Any) -> None:
        shutdown_tracing()

    worker_init.connect(in_main, weak=False)
    worker_process_init.connect(in_child, weak=False)
    worker_shutdown.connect(flush, weak=False)
    worker_process_shutdown.connect(flush, weak=False)


def fastapi_telemetry() -> TelemetryConfig:
    """FastAPI's own telemetry settings (``FastAPI(telemetry=...)``): a server span per
    request, none per dependency or serialisation step, none for ``UNTRACED_PATHS``."""

    def exclude(scope: MutableMapping[str, Any]) -> bool:
        return scope.get("path") in UNTRACED_PATHS

    return {"operation_spans": False, "exclude": exclude}


def inject() -> dict[str, str]:
    """The current trace context as a carrier (``traceparent``...); empty when tracing is
    off, so nothing is stored or sent then."""
    carrier: dict[str, str] = {}
    if trace.get_current_span().get_span_context().is_valid:
        propagate.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context | None:
    """The context ``inject`` wrote into ``carrier`` (None when there is none)."""
    if not carrier:
        return None
    return propagate.extract(dict(carrier))


def link_to_current() -> Sequence[Link]:
    """A link to the current span, for a span that starts a trace of its own."""
    current = trace.get_current_span().get_span_context()
    return [Link(current)] if current.is_valid else []


@contextlib.contextmanager
def root_span(name: str, **kwargs: Any) -> Iterator[Span]:
    """A span that starts a new trace (linked to the current span, if any)."""
    links = link_to_current()
    with tracer.start_as_current_span(
        name, context=otel_context.Context(), links=links, **kwargs
    ) as span:
        yield span


__all__ = [
    "Attributes",
    "ChildOnlyTracerProvider",
    "SpanKind",
    "configure_tracing",
    "extract",
    "fastapi_telemetry",
    "inject",
    "root_span",
    "shutdown_tracing",
    "trace_celery_worker",
    "tracer",
    "tracing_on",
    "tracing_wanted",
]
