"""``shared/tracing.py``: off without OTEL_* (the API's no-op provider, nothing exported),
on with an OTLP endpoint (spans reach the receiver). Each case is its own Python process:
a tracer provider is set once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from signalbox.shared.tracing import tracing_wanted
from tests.otlp_receiver import OtlpReceiver

PROBE = """
import json
from opentelemetry import trace
from signalbox.shared.tracing import configure_tracing, shutdown_tracing, tracer
on = configure_tracing("signalbox-probe")
with tracer.start_as_current_span("probe") as span:
    recording = span.is_recording()
    valid = span.get_span_context().is_valid
shutdown_tracing()
print(json.dumps({"on": on, "provider": type(trace.get_tracer_provider()).__name__,
                  "recording": recording, "valid": valid}))
"""


def _probe(extra: dict[str, str]) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


def test_without_otel_variables_the_provider_is_the_apis_no_op_and_nothing_is_exported(
    receiver: OtlpReceiver,
) -> None:
    # The receiver listens, but nothing says where it is: nothing may be sent anywhere.
    probed = _probe({})
    assert probed == {
        "on": False,
        "provider": "ProxyTracerProvider",  # the API's default: no SDK installed
        "recording": False,
        "valid": False,
    }
    assert receiver.requests == 0


def test_with_an_otlp_endpoint_the_spans_are_exported_there(receiver: OtlpReceiver) -> None:
    probed = _probe(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "probe-by-env"}
    )
    assert probed["on"] is True and probed["recording"] is True
    # shutdown_tracing flushed before the process exited: the span is there already.
    [span] = [s for s in receiver.received() if s.name == "probe"]
    assert span.service == "probe-by-env"  # OTEL_SERVICE_NAME wins over the default name


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
)
def test_traces_are_wanted_only_when_an_exporter_is_configured(
    env: dict[str, str], wanted: bool
) -> None:
    assert tracing_wanted(env) is wanted
