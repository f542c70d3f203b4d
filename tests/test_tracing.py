"""Optional OpenTelemetry tracing (issue 16, item 3): with ENGRAM_OTEL_ENDPOINT set, every
request's span goes over OTLP/HTTP to that endpoint (here a collector on loopback that keeps
what it is sent). Skipped when the `otel` extra is not installed."""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from helpers import db_settings
from servers import serving

pytest.importorskip("opentelemetry.sdk", reason="pip install -e '.[otel]' for tracing")

TOKEN = "tracing-test-admin-token"


class Collector(BaseHTTPRequestHandler):
    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (the name http.server calls)
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.received.append((self.path, self.headers.get("content-type", ""), body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list]]:
    Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1/traces", Collector.received
    finally:
        server.shutdown()
        server.server_close()


async def test_requests_are_traced_to_the_otlp_endpoint(db_url, embedder, collector):
    endpoint, received = collector
    settings = db_settings(db_url, bootstrap_token=TOKEN, otel_endpoint=endpoint)
    with serving(settings, embedder) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            answer = await http.post(
                "/graphql",
                json={"query": "{ viewer { principal } }"},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert answer.json() == {"data": {"viewer": {"principal": "admin"}}}
    # Stopping the service sent the batched spans.
    assert received, "no spans reached the collector"
    path, content_type, body = received[0]
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    sent = b"".join(r[2] for r in received)
    assert b"engram" in sent and b"/graphql" in sent and TOKEN.encode() not in sent
