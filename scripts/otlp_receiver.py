"""A small OTLP/HTTP trace receiver for the integration tests.

It listens on 127.0.0.1 only, on a free port, and prints `port N` once it is ready.
POST /v1/traces takes an ExportTraceServiceRequest, as protobuf (gzip allowed) or JSON.
It decodes it with OpenTelemetry's own protobuf classes and keeps every span.
GET /spans answers {"requests": n, "spans": [...]}; DELETE /spans resets both.
Mode `slow` answers only after --slow-seconds, like a collector that hangs.
Mode `refuse` answers 503 to every export. Both still count the requests.
Spans are kept only when the export is answered 200.

Usage: otlp_receiver.py [--mode ok|slow|refuse] [--slow-seconds N]
"""

import argparse
import base64
import gzip
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

LOCK = threading.Lock()
STATE = {"requests": 0, "spans": []}
ID_KEYS = ("traceId", "spanId", "parentSpanId")


def value(any_value):
    """An OTLP AnyValue as a plain Python value."""
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return attributes(any_value.kvlist_value.values)
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    return getattr(any_value, kind) if kind else None


def attributes(key_values):
    return {kv.key: value(kv.value) for kv in key_values}


def span_dict(span, resource, scope):
    return {
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex(),
        "name": span.name,
        "kind": span.kind,
        "start_unix_nano": span.start_time_unix_nano,
        "end_unix_nano": span.end_time_unix_nano,
        "attributes": attributes(span.attributes),
        "status": {"code": span.status.code, "message": span.status.message},
        "links": [{"trace_id": k.trace_id.hex(), "span_id": k.span_id.hex()} for k in span.links],
        "events": [{"name": e.name, "attributes": attributes(e.attributes)} for e in span.events],
        "resource": resource,
        "scope": scope,
    }


def spans_of(request):
    """Every span of an ExportTraceServiceRequest, as dicts."""
    out = []
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            out += [span_dict(s, resource, ss.scope.name) for s in ss.spans]
    return out


def hex_ids_to_base64(node):
    """OTLP JSON writes IDs as hex; protobuf's JSON parser wants base64."""
    if isinstance(node, list):
        return [hex_ids_to_base64(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: hex_ids_to_base64(v) for k, v in node.items()}
    for key in ID_KEYS:
        text = out.get(key)
        if isinstance(text, str) and len(text) in (0, 16, 32):
            out[key] = base64.b64encode(bytes.fromhex(text)).decode()
    return out


def decode(body, content_type):
    request = ExportTraceServiceRequest()
    if content_type == "application/json":
        json_format.Parse(json.dumps(hex_ids_to_base64(json.loads(body))), request)
    else:
        request.ParseFromString(body)
    return request


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps exporters' connections alive

    def log_message(self, *args):  # quiet: stdout carries only the port line
        return

    def answer(self, code, body=b"", content_type="application/x-protobuf"):
        try:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except ConnectionError:  # the client gave up waiting (mode slow): nothing to tell
            self.close_connection = True

    def body(self):
        """The request body, read whole (Content-Length or chunked), un-gzipped."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                data += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        gzipped = self.headers.get("Content-Encoding", "").lower() == "gzip"
        return gzip.decompress(data) if gzipped else data

    def do_POST(self):
        if self.path.split("?")[0] != "/v1/traces":
            return self.answer(404)
        data = self.body()
        with LOCK:
            STATE["requests"] += 1
        if MODE == "refuse":
            return self.answer(503)
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            spans = spans_of(decode(data, content_type))
        except Exception as error:  # a malformed export is the client's fault
            return self.answer(400, str(error).encode(), "text/plain")
        if MODE == "slow":
            time.sleep(SLOW_SECONDS)
        with LOCK:
            STATE["spans"] += spans
        if content_type == "application/json":
            return self.answer(200, b"{}", "application/json")
        self.answer(200, ExportTraceServiceResponse().SerializeToString())

    def do_GET(self):
        if self.path != "/spans":
            return self.answer(404)
        with LOCK:
            text = json.dumps(STATE)
        self.answer(200, text.encode(), "application/json")

    def do_DELETE(self):
        if self.path != "/spans":
            return self.answer(404)
        with LOCK:
            STATE.update(requests=0, spans=[])
        self.answer(200, b"{}", "application/json")


def main():
    global MODE, SLOW_SECONDS
    parser = argparse.ArgumentParser(description="OTLP/HTTP trace receiver for tests")
    parser.add_argument("--mode", choices=["ok", "slow", "refuse"], default="ok")
    parser.add_argument("--slow-seconds", type=float, default=30.0)
    args = parser.parse_args()
    MODE, SLOW_SECONDS = args.mode, args.slow_seconds
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True  # a slow answer never holds up the exit
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
