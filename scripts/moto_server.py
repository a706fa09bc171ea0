"""Runs the moto AWS emulator on 127.0.0.1, one DynamoDB or S3 request at a time.

moto's own server is threaded, and its conditional writes (DynamoDB conditions, S3
If-None-Match) are not atomic under concurrent requests. Serialising those requests makes
each one atomic, so race tests exercise the worker's conditions rather than moto's races.
SQS requests are left concurrent: a long poll (WaitTimeSeconds) would otherwise hold every
other request up, and SQS promises no more than at-least-once delivery anyway.

Usage: moto_server.py [PORT]   (0 or none: any free port). Prints the port on stdout.
"""

import os
import sys
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server


def one_at_a_time(app):
    lock = threading.Lock()

    def serialised(environ, start_response):
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("AmazonSQS."):
            return list(app(environ, start_response))
        with lock:
            return list(app(environ, start_response))

    return serialised


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server(
        "127.0.0.1",
        port,
        one_at_a_time(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )
    os.environ["MOTO_PORT"] = str(server.port)
    print(server.port, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
