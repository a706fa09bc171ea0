"""Runs the moto AWS emulator on 127.0.0.1, one DynamoDB or S3 request at a time.

moto's own server is threaded, and its conditional writes (DynamoDB conditions, S3
If-None-Match) are not atomic under concurrent requests. Serialising those requests makes
each one atomic, so race tests exercise the worker's conditions rather than moto's races.
SQS requests are left concurrent: a long poll (WaitTimeSeconds) would otherwise hold every
other request up, and SQS promises no more than at-least-once delivery anyway.

Two costs in moto 5.2 grow with the data and stall a run of hundreds of tasks; both are
patched here without changing what any request returns:
- TransactWriteItems deep-copies every table it touches, to roll back on failure.
  `copy_touched_items_only` keeps the rollback but snapshots just the items the
  transaction names (requests are serialised: nothing else can change them meanwhile).
- SQS computes every queue attribute, each approximate count a scan of the queue, three
  times per attribute asked for in GetQueueAttributes, and again for each message that
  ReceiveMessage returns (to check its retention period). `compute_queue_attributes_once`
  computes them once per GetQueueAttributes and reads the retention period directly.

Two more costs are per request, not per item, and patched the same way: moto finds the
service a request is for by listing its own package folder and matching a few hundred URL
patterns (`remember_backends` keeps each answer), and SQS reads the clock through datetime
arithmetic for every message of a queue on every receive, send and count (`fast_sqs_clock`
reads it once per scan, as a float).

CopyObject's conditions (`If-None-Match` and `If-Match` on the destination,
`x-amz-copy-source-if-match` on the source), which moto ignores, are applied here as S3
applies them.

It also counts the write units DynamoDB would bill for every write (moto answers a constant
ConsumedCapacity), read back as `write_units` in the production-like layer's stats.

Requests signed as the worker's role are checked against what template.yaml grants it, on
both ports (`iam_role.py`).

The same moto is also served behind `prodlike.py` (conflicts, stale reads, S3 limits, as
production has them) on a second port, for the tests that ask for it.

Usage: moto_server.py [PORT [PRODLIKE_PORT]]   (0 or none: any free port). Prints the two
ports on stdout, one a line: moto's, then the production-like layer's.
"""

import copy
import os
import sys
import threading
import time
import types

import iam_role
import prodlike

import moto.dynamodb.models as dynamodb_models
from moto.core.utils import unix_time
from moto.dynamodb.models.table import Table
from moto.sqs.exceptions import InvalidAttributeName
from moto.sqs.models import SQSBackend

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


def copy_touched_items_only():
    backend = dynamodb_models.DynamoDBBackend
    transact = backend.transact_write_items

    def deepcopy_except_tables(obj, memo=None):
        # The original's table snapshot becomes the live table, so its own rollback is
        # a no-op; the items it touched are restored below instead.
        return obj if isinstance(obj, Table) else copy.deepcopy(obj, memo)

    dynamodb_models.copy = types.SimpleNamespace(deepcopy=deepcopy_except_tables)

    def touched(self, transact_items):
        for entry in transact_items:
            for op in entry.values():
                table = self.tables.get(op.get("TableName"))
                attrs = op.get("Key") or op.get("Item") or {}
                if table is None:
                    continue
                try:
                    hash_key, range_key = self.get_keys_value(table, attrs)
                except Exception:
                    continue  # moto itself rejects the request before changing anything
                yield table, hash_key, range_key

    def restore(table, hash_key, range_key, item):
        if item is None:
            if table.get_item(hash_key, range_key) is not None:
                table.delete_item(hash_key, range_key)
        elif range_key is None:
            table.items[hash_key] = item
        else:
            table.items[hash_key][range_key] = item

    def transact_write_items(self, transact_items):
        saved = [
            (table, hash_key, range_key, copy.deepcopy(table.get_item(hash_key, range_key)))
            for table, hash_key, range_key in touched(self, transact_items)
        ]
        try:
            transact(self, transact_items)
        except Exception:
            for entry in reversed(saved):
                restore(*entry)
            raise

    backend.transact_write_items = transact_write_items


def count_write_units():
    """DynamoDB's write units for each write as it bills them: a unit per KB (rounded up, at
    least one) of the larger of the item's images before and after; twice that in a
    transaction; a write its condition refused costs the same. ConditionCheck entries are
    not counted."""
    backend = dynamodb_models.DynamoDBBackend
    in_transaction = threading.local()

    def size_of(self, table_name, attrs):
        table = self.tables.get(table_name)
        try:
            hash_key, range_key = self.get_keys_value(table, attrs)
            item = table.get_item(hash_key, range_key)
        except Exception:
            return 0
        return item.size() if item is not None else 0

    def counted(original):
        def write(self, table_name, attrs, *args, **kwargs):
            before = size_of(self, table_name, attrs)
            try:
                return original(self, table_name, attrs, *args, **kwargs)
            finally:
                after = size_of(self, table_name, attrs)
                units = max(1, -(-max(before, after) // 1024))
                twice = 2 if getattr(in_transaction, "on", False) else 1
                prodlike.STATE.count("write_units", table_name, units * twice)

        return write

    def transactional(original):
        def transact(self, transact_items):
            in_transaction.on = True
            try:
                return original(self, transact_items)
            finally:
                in_transaction.on = False

        return transact

    for name in ("put_item", "update_item", "delete_item"):
        setattr(backend, name, counted(getattr(backend, name)))
    backend.transact_write_items = transactional(backend.transact_write_items)


def conditional_copies():
    """CopyObject as S3 conditions it (moto 5.2 ignores these headers): `If-None-Match: *`
    refuses a destination key that holds an object, `If-Match` one whose ETag is another
    (404 NoSuchKey when there is none), and `x-amz-copy-source-if-match` a source whose ETag
    is another, each with 412 PreconditionFailed. S3 requests are
    serialised here, so the check and the copy are one step."""
    from urllib.parse import unquote, urlparse

    from moto.s3.exceptions import MissingKey, PreconditionFailed
    from moto.s3.responses import S3Response

    copy_object = S3Response.copy_object

    def conditional_copy_object(self):
        source = urlparse(self.headers.get("x-amz-copy-source", ""))
        src_bucket, _, src_key = unquote(source.path).lstrip("/").partition("/")
        if self.headers.get("If-None-Match") == "*" and self.backend.get_object(
            self.bucket_name, self.parse_key_name()
        ) is not None:
            raise PreconditionFailed("If-None-Match")
        replaced = self.headers.get("If-Match")
        if replaced is not None:
            there = self.backend.get_object(self.bucket_name, self.parse_key_name())
            if there is None:
                raise MissingKey(key=self.parse_key_name())
            if there.etag.strip('"') != replaced.strip('"'):
                raise PreconditionFailed("If-Match")
        wanted = self.headers.get("x-amz-copy-source-if-match")
        if wanted is not None:
            found = self.backend.get_object(src_bucket, src_key)
            if found is None or found.etag.strip('"') != wanted.strip('"'):
                raise PreconditionFailed("x-amz-copy-source-If-Match")
        return copy_object(self)

    S3Response.copy_object = conditional_copy_object


def compute_queue_attributes_once():
    def get_queue_attributes(self, queue_name, attribute_names):
        queue = self.get_queue(queue_name)
        if not attribute_names:
            return {}
        valid = ["All"] + queue.BASE_ATTRIBUTES + queue.FIFO_ATTRIBUTES + queue.KMS_ATTRIBUTES
        invalid = next((name for name in attribute_names if name not in valid), None)
        if invalid is not None:
            raise InvalidAttributeName(invalid)
        every = queue.attributes
        if "All" in attribute_names:
            return every
        return {name: every[name] for name in attribute_names if every.get(name) is not None}

    def is_message_valid_based_on_retention_period(self, queue_name, message):
        retention = self.get_queue(queue_name).message_retention_period
        return int(retention) + message.sent_timestamp / 1000 > unix_time()

    SQSBackend.get_queue_attributes = get_queue_attributes
    SQSBackend.is_message_valid_based_on_retention_period = (
        is_message_valid_based_on_retention_period
    )


def remember_backends():
    import moto.backends

    modules = tuple(moto.backends.list_of_moto_modules())
    moto.backends.list_of_moto_modules = lambda: modules
    find = DomainDispatcherApplication.get_backend_for_host
    found = {}

    def get_backend_for_host(self, host):
        if host not in found:
            found[host] = find(self, host)
        return found[host]

    DomainDispatcherApplication.get_backend_for_host = get_backend_for_host


def fast_sqs_clock():
    """The same comparisons as moto's Message.visible and .delayed, with the clock read once
    per scan of a queue (moto converts datetimes twice per message)."""
    from moto.sqs.models import Message, Queue

    def now_ms():
        return time.time() * 1000.0

    def visible_at(message, now):
        return now > message.visible_at

    def delayed_at(message, now):
        return now < message.delayed_until

    Message.visible = property(lambda m: visible_at(m, now_ms()))
    Message.delayed = property(lambda m: delayed_at(m, now_ms()))

    def messages(queue):
        now = now_ms()
        return [m for m in queue._messages if visible_at(m, now) and not delayed_at(m, now)]

    def delayed(queue):
        now = now_ms()
        return sum(1 for m in queue._messages if delayed_at(m, now))

    def not_visible(queue):
        now = now_ms()
        return sum(1 for m in queue._messages if not visible_at(m, now))

    Queue.messages = property(messages)
    Queue.approximate_number_of_messages_delayed = property(delayed)
    Queue.approximate_number_of_messages_not_visible = property(not_visible)


class QuietHandler(MotoRequestHandler):
    """moto's handler without its line on stderr for every request."""

    def log_request(self, *args, **kwargs):
        pass


def serve(port, app):
    return make_server("127.0.0.1", port, app, threaded=True, request_handler=QuietHandler)


def main():
    copy_touched_items_only()
    count_write_units()
    conditional_copies()
    compute_queue_attributes_once()
    remember_backends()
    fast_sqs_clock()
    ports = [int(p) for p in sys.argv[1:3]] + [0, 0]
    moto = one_at_a_time(prodlike.Recording(DomainDispatcherApplication(create_backend_app)))
    app = iam_role.Enforce(moto)
    server = serve(ports[0], app)
    layer = serve(ports[1], prodlike.ProdLike(app))
    os.environ["MOTO_PORT"] = str(server.port)
    print(server.port, flush=True)
    print(layer.port, flush=True)
    threading.Thread(target=layer.serve_forever, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
