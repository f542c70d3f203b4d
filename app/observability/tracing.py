"""Optional OpenTelemetry tracing (the `otel` extra): a span for every HTTP request, sent over
OTLP/HTTP to ENGRAM_OTEL_ENDPOINT. Off unless that setting is given."""

from typing import Any

MISSING = (
    "ENGRAM_OTEL_ENDPOINT is set, but OpenTelemetry is not installed: "
    "pip install -e '.[otel]' (or unset ENGRAM_OTEL_ENDPOINT)"
)


def tracer_provider(endpoint: str) -> Any:
    """A provider of this app's own (not the process-wide one: a process may hold several
    apps) that batches spans to `endpoint`, e.g. http://127.0.0.1:4318/v1/traces."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        raise RuntimeError(MISSING) from e
    provider = TracerProvider(resource=Resource.create({"service.name": "engram"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def middleware() -> Any:
    try:
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    except ImportError as e:
        raise RuntimeError(MISSING) from e
    return OpenTelemetryMiddleware
