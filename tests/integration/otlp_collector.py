"""A stand-in OpenTelemetry collector for the tracing tests: an HTTP server on 127.0.0.1 (port 0)
that takes OTLP/HTTP JSON exports (POST /v1/traces) and keeps the spans it decoded, or, in
`mode="silent"`, accepts connections and never answers (a collector that hangs).

  collector = Collector()
  ... pdrouter with tracing.endpoint = collector.endpoint ...
  spans = collector.wait_for(lambda spans: ..., timeout)
  collector.close()

Each span is the OTLP JSON object as sent, with "_resource" (its resource attributes as a dict)
and "_attributes" (its attributes as a dict of plain values) added.
"""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pdrouter_fixture import TIME_SCALE


def attribute_value(value):
    for kind in ("stringValue", "boolValue", "doubleValue"):
        if kind in value:
            return value[kind]
    if "intValue" in value:
        return int(value["intValue"])
    raise AssertionError("unexpected attribute value %r" % value)


def attributes(items):
    return {a["key"]: attribute_value(a["value"]) for a in items}


class Collector:
    def __init__(self, mode="record"):
        self.mode = mode
        self.lock = threading.Lock()
        self.spans = []
        self.exports = []  # (content type, body bytes) as received
        if mode == "silent":
            self.sock = socket.socket()
            self.sock.bind(("127.0.0.1", 0))
            self.sock.listen(64)
            self.port = self.sock.getsockname()[1]
            self.server = None
            return
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.record(self.path, self.headers.get("Content-Type"), body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d/v1/traces" % self.port

    def record(self, path, content_type, body):
        assert path == "/v1/traces", path
        decoded = json.loads(body)  # the wire format: OTLP/JSON, checked by decoding it
        spans = []
        for resource_spans in decoded["resourceSpans"]:
            resource = attributes(resource_spans["resource"]["attributes"])
            for scope_spans in resource_spans["scopeSpans"]:
                for span in scope_spans["spans"]:
                    span["_resource"] = resource
                    span["_scope"] = scope_spans["scope"]
                    span["_attributes"] = attributes(span.get("attributes", []))
                    spans.append(span)
        with self.lock:
            self.exports.append((content_type, body))
            self.spans.extend(spans)

    def snapshot(self):
        with self.lock:
            return list(self.spans)

    def wait_for(self, predicate, timeout=10):
        deadline = time.monotonic() + timeout * TIME_SCALE
        while True:
            spans = self.snapshot()
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError("collector: condition not met; %d spans: %s" % (
                    len(spans), [(s["name"], s["traceId"]) for s in spans]))
            time.sleep(0.02)

    def close(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        else:
            self.sock.close()


def dead_endpoint():
    """An OTLP endpoint where nothing listens (a collector that is down)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return "http://127.0.0.1:%d/v1/traces" % port
