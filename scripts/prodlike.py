"""A layer in front of moto that behaves like production AWS where moto does not.

moto answers every request as if it were alone: strongly consistent, never a transaction
conflict, no limit on S3 request headers. Production DynamoDB and S3 are harsher, and the
worker must survive them. `scripts/moto_server.py` serves moto twice: as it is on one port
(AWS_ENDPOINT_URL), and behind this layer on another (PRODLIKE_ENDPOINT_URL). A test chooses
per client which one it talks to, so the layer is switched on or off per test.

What the layer does, and only on its own port:

| production behaviour | modelled as |
|---|---|
| DynamoDB cancels a TransactWriteItems that overlaps another transaction on an item: `TransactionCanceledException`, reason `TransactionConflict` for that item | a transaction holds its items for `PRODLIKE_TRANSACTION_MS` (default 30) before it commits; one that names a held item is cancelled |
| DynamoDB refuses a PutItem / UpdateItem / DeleteItem on an item of a transaction in flight: `TransactionConflictException` | the same holds |
| reads without `ConsistentRead` may miss recent writes | GetItem and BatchGetItem without it answer an item written in the last `PRODLIKE_STALE_MS` (default 1000) as it was before those writes (absent, if it was) |
| S3 answers 409 `ConditionalRequestConflict` to a conditional PUT racing another on the same key | a conditional PUT holds its key for `PRODLIKE_PUT_MS` (default 30); one that meets a held key gets the 409 |
| S3 refuses request headers over 8 KB (`RequestHeaderSectionTooLarge`) and user metadata over 2 KB (`MetadataTooLarge`) | both refused with 400 |
| a transaction writing an item over 400 KB is cancelled, reason `ValidationError` (moto refuses the whole request with `ValidationException`) | moto's answer turned into DynamoDB's, the reason on every item |

moto already refuses DynamoDB items over 400 KB. Writes through either port are recorded for
the stale reads (a producer seeding through the plain port is read stale through this one).

Admin paths on the layer's port, for tests:
- `GET /_prodlike/stats`: what the layer did, `{kind: {table or bucket: count}}`; also
  `write_units`, the write units DynamoDB would bill for every write through either port
  (scripts/moto_server.py counts them).
- `POST /_prodlike/throttle` with `{"table": T, "share": S, "seconds": D}`: for the next D
  seconds, a share S of the writes to table T (PutItem, UpdateItem, DeleteItem,
  TransactWriteItems) is answered `ProvisionedThroughputExceededException`, as a hot
  partition or a new table's capacity answers; `stats` counts `writes` and `throttled`.
- `POST /_prodlike/conflict` with `{"table": T, "key": {...DynamoDB key...}, "times": N}` or
  `{"bucket": B, "key": K, "times": N}`: the next N writes of that item (or conditional PUTs
  of that object) meet a transaction (or a PUT) in flight, whatever the timing, so a test
  meets exactly the conflicts it asks for.

Not modelled: Query and Scan staleness, TransactGetItems, conflicts of a transaction with a
single-item write already in flight, throttling by partition capacity (only the throttle a
test asks for), SQS's own differences (moto's SQS is left as it is).
"""

import io
import json
import os
import random
import threading
import time
import zlib
from collections import Counter, defaultdict
from urllib.parse import unquote

from moto.core import DEFAULT_ACCOUNT_ID
from moto.dynamodb.models import dynamodb_backends
from moto.dynamodb.models.dynamo_type import DynamoType

DYNAMODB_TARGET = "DynamoDB_20120810."
HEADER_LIMIT = 8 * 1024
METADATA_LIMIT = 2 * 1024
SINGLE_WRITES = {"PutItem", "UpdateItem", "DeleteItem"}


def setting(name, default):
    return float(os.environ.get(name, default)) / 1000.0


class State:
    """What the layer remembers: items and keys held, recent writes, and what it did."""

    def __init__(self):
        self.lock = threading.Lock()
        self.held_items = Counter()  # (table, key) of transactions in flight
        self.held_objects = Counter()  # (bucket, key) of conditional PUTs in flight
        self.forced_items = Counter()  # (table, key): conflicts a test asked for
        self.forced_objects = Counter()  # (bucket, key): likewise
        self.history = defaultdict(list)  # (table, key) -> [(written at, image before)]
        self.stats = defaultdict(Counter)
        self.transaction_s = setting("PRODLIKE_TRANSACTION_MS", 30)
        self.put_s = setting("PRODLIKE_PUT_MS", 30)
        self.stale_s = setting("PRODLIKE_STALE_MS", 1000)
        self.throttles = {}  # table -> (share of writes refused, until, monotonic)

    def throttled(self, table):
        """Whether this write to `table` is refused by a throttle a test asked for."""
        with self.lock:
            share, until = self.throttles.get(table, (0.0, 0.0))
            return time.monotonic() < until and random.random() < share

    def count(self, kind, resource, n=1):
        with self.lock:
            self.stats[kind][resource] += n

    def try_hold(self, held, forced, keys):
        """Holds every key, or none if any is held already (or a test asked for a conflict
        on it): the keys met, if any."""
        with self.lock:
            met = [k for k in keys if held[k] > 0 or forced[k] > 0]
            for k in met:
                if forced[k] > 0:
                    forced[k] -= 1
            if not met:
                for k in keys:
                    held[k] += 1
            return met

    def release(self, held, keys):
        with self.lock:
            for k in keys:
                held[k] -= 1
                if held[k] <= 0:
                    del held[k]

    def force(self, forced, key, times):
        with self.lock:
            forced[key] += times

    def is_held(self, held, forced, keys):
        """Whether a write of these keys meets a transaction in flight (using up a conflict
        a test asked for)."""
        with self.lock:
            for k in keys:
                if forced[k] > 0:
                    forced[k] -= 1
                    return True
            return any(held[k] > 0 for k in keys)

    def record(self, table, key, before, at):
        with self.lock:
            entries = self.history[(table, key)]
            entries.append((at, before))
            while entries and entries[0][0] < at - self.stale_s:
                entries.pop(0)

    def stale_image(self, table, key, now):
        """(True, image) when a read now would still see the item as it was before its
        recent writes; (False, None) when it sees the latest."""
        with self.lock:
            recent = [e for e in self.history.get((table, key), []) if e[0] > now - self.stale_s]
            return (True, recent[0][1]) if recent else (False, None)


STATE = State()


# --- requests and responses ----------------------------------------------------------------

def read_body(environ):
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def call(app, environ):
    """Runs the inner app: (status line, headers, body bytes)."""
    answer = {}

    def start_response(status, headers, exc_info=None):
        answer["status"], answer["headers"] = status, headers

    body = b"".join(app(environ, start_response))
    return answer["status"], answer["headers"], body


def respond(start_response, status, headers, body):
    # Length and DynamoDB's CRC32 of the body as sent (the layer may have changed it).
    json_api = any(k.lower() == "content-type" and "amz-json" in v for k, v in headers)
    headers = [(k, v) for k, v in headers if k.lower() not in ("content-length", "x-amz-crc32")]
    headers.append(("Content-Length", str(len(body))))
    if json_api:
        headers.append(("x-amz-crc32", str(zlib.crc32(body))))
    start_response(status, headers)
    return [body]


def respond_json(start_response, answer):
    headers = [("Content-Type", "application/x-amz-json-1.0")]
    return respond(start_response, "200 OK", headers, json.dumps(answer).encode())


def dynamodb_error(start_response, kind, message, **extra):
    body = {"__type": f"com.amazonaws.dynamodb.v20120810#{kind}", "message": message, **extra}
    headers = [("Content-Type", "application/x-amz-json-1.0")]
    return respond(start_response, "400 Bad Request", headers, json.dumps(body).encode())


def s3_error(start_response, status, code, message):
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>prodlike</RequestId></Error>").encode()
    return respond(start_response, status, [("Content-Type", "application/xml")], body)


def region_and_service(environ):
    # Authorization: AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request, ...
    auth = environ.get("HTTP_AUTHORIZATION", "")
    scope = auth.split("Credential=", 1)[-1].split(",", 1)[0].split("/")
    return (scope[2], scope[3]) if len(scope) >= 5 else ("us-east-1", "")


# --- DynamoDB keys and images --------------------------------------------------------------

def table_of(region, name):
    try:
        return dynamodb_backends[DEFAULT_ACCOUNT_ID][region].get_table(name)
    except Exception:
        return None


def key_of(table, attributes):
    """The canonical text of an item's key, from its key attributes."""
    names = [n for n in (table.hash_key_attr, table.range_key_attr) if n]
    return json.dumps({n: attributes.get(n) for n in names}, sort_keys=True)


def image(table, key_text):
    """The item under a key as DynamoDB JSON, or None."""
    key = json.loads(key_text)
    hash_key = DynamoType(key[table.hash_key_attr])
    range_key = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
    try:
        item = table.get_item(hash_key, range_key)
    except Exception:
        return None
    return item.to_json()["Attributes"] if item is not None else None


def written(operation, request):
    """(table name, key attributes, written?) of every item a write request names."""
    if operation in ("UpdateItem", "DeleteItem"):
        yield request["TableName"], request["Key"], True
    elif operation == "PutItem":
        yield request["TableName"], request["Item"], True
    elif operation == "TransactWriteItems":
        for entry in request.get("TransactItems", []):
            for kind, op in entry.items():
                yield op["TableName"], op.get("Key") or op.get("Item", {}), kind != "ConditionCheck"
    elif operation == "BatchWriteItem":
        for name, requests in request.get("RequestItems", {}).items():
            for r in requests:
                put = r.get("PutRequest", {}).get("Item")
                yield name, put if put is not None else r["DeleteRequest"]["Key"], True


def written_table(operation, request):
    """The table a write request names (a transaction's first item's)."""
    return next((name for name, _, _ in written(operation, request)), "")


def item_keys(region, operation, request, only_written=False):
    keys = []
    for name, attributes, writes in written(operation, request):
        table = table_of(region, name)
        if table is not None and (writes or not only_written):
            keys.append((name, key_of(table, attributes)))
    return keys


class Recording:
    """Inside moto's one-at-a-time lock: remembers each DynamoDB write's before-image, so a
    later eventually consistent read can be answered stale. On both ports."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        operation = target[len(DYNAMODB_TARGET):] if target.startswith(DYNAMODB_TARGET) else ""
        if operation not in SINGLE_WRITES | {"TransactWriteItems", "BatchWriteItem"}:
            return self.app(environ, start_response)
        request = json.loads(read_body(environ) or b"{}")
        region, _ = region_and_service(environ)
        keys = item_keys(region, operation, request, only_written=True)
        before = [(name, key, image(table_of(region, name), key)) for name, key in keys]
        status, headers, body = call(self.app, environ)
        if status.startswith("200"):
            now = time.monotonic()
            for name, key, item in before:
                STATE.record(name, key, item, now)
        return respond(start_response, status, headers, body)


# --- the layer -----------------------------------------------------------------------------

def project(item, request):
    """The top-level attributes a ProjectionExpression names (nested paths not modelled)."""
    expression = request.get("ProjectionExpression")
    if item is None or not expression:
        return item
    names = request.get("ExpressionAttributeNames", {})
    wanted = {names.get(p.strip(), p.strip()) for p in expression.split(",")}
    return {k: v for k, v in item.items() if k in wanted}


class ProdLike:
    """The layer: conflicts, stale reads and S3 limits in front of the (serialised) app."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path.startswith("/_prodlike/"):
            return self.admin(path, environ, start_response)
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target.startswith(DYNAMODB_TARGET):
            return self.dynamodb(target[len(DYNAMODB_TARGET):], environ, start_response)
        if region_and_service(environ)[1] == "s3":
            return self.s3(environ, start_response)
        return self.app(environ, start_response)

    def admin(self, path, environ, start_response):
        if path == "/_prodlike/stats":
            with STATE.lock:
                body = json.dumps({k: dict(v) for k, v in STATE.stats.items()}).encode()
            return respond(start_response, "200 OK", [("Content-Type", "application/json")], body)
        if path == "/_prodlike/throttle" and environ["REQUEST_METHOD"] == "POST":
            ask = json.loads(read_body(environ))
            with STATE.lock:
                until = time.monotonic() + float(ask["seconds"])
                STATE.throttles[ask["table"]] = (float(ask["share"]), until)
            return respond(start_response, "204 No Content", [], b"")
        if path == "/_prodlike/conflict" and environ["REQUEST_METHOD"] == "POST":
            ask = json.loads(read_body(environ))
            if "table" in ask:
                table = table_of(ask.get("region", "us-east-1"), ask["table"])
                key = (ask["table"], key_of(table, ask["key"]))
                STATE.force(STATE.forced_items, key, ask["times"])
            else:
                STATE.force(STATE.forced_objects, (ask["bucket"], ask["key"]), ask["times"])
            return respond(start_response, "204 No Content", [], b"")
        return respond(start_response, "404 Not Found", [], b"")

    def dynamodb(self, operation, environ, start_response):
        if operation not in SINGLE_WRITES | {"TransactWriteItems", "GetItem", "BatchGetItem"}:
            return self.app(environ, start_response)
        request = json.loads(read_body(environ) or b"{}")
        region, _ = region_and_service(environ)
        if operation in SINGLE_WRITES | {"TransactWriteItems"}:
            table = written_table(operation, request)
            STATE.count("writes", table)
            if STATE.throttled(table):
                STATE.count("throttled", table)
                return dynamodb_error(start_response, "ProvisionedThroughputExceededException",
                                      "The level of configured provisioned throughput for the "
                                      "table was exceeded")
        if operation == "TransactWriteItems":
            return self.transaction(region, request, environ, start_response)
        if operation in SINGLE_WRITES:
            keys = item_keys(region, operation, request)
            if STATE.is_held(STATE.held_items, STATE.forced_items, keys):
                STATE.count("write_conflicts", request["TableName"])
                return dynamodb_error(start_response, "TransactionConflictException",
                                      "Transaction is ongoing for the item")
            return self.app(environ, start_response)
        if operation == "GetItem":
            return self.get_item(region, request, environ, start_response)
        return self.batch_get_item(region, request, environ, start_response)

    def get_item(self, region, request, environ, start_response):
        name = request["TableName"]
        stale, before = self.stale(region, name, request, request["Key"])
        if not stale:
            return self.app(environ, start_response)
        answer = {"Item": project(before, request)} if before is not None else {}
        return respond_json(start_response, answer)

    def batch_get_item(self, region, request, environ, start_response):
        """Asks moto for the keys read fresh; answers the others as they were."""
        old = {}
        for name, ask in list(request.get("RequestItems", {}).items()):
            fresh = []
            for key in ask.get("Keys", []):
                stale, before = self.stale(region, name, ask, key)
                if not stale:
                    fresh.append(key)
                elif before is not None:
                    old.setdefault(name, []).append(project(before, ask))
            ask["Keys"] = fresh
            if not fresh:
                del request["RequestItems"][name]
        answer = {"Responses": {}, "UnprocessedKeys": {}}
        if request["RequestItems"]:
            body = json.dumps(request).encode()
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
            status, headers, body = call(self.app, environ)
            if not status.startswith("200"):
                return respond(start_response, status, headers, body)
            answer = json.loads(body)
        for name, items in old.items():
            answer.setdefault("Responses", {}).setdefault(name, []).extend(items)
        return respond_json(start_response, answer)

    def transaction(self, region, request, environ, start_response):
        keys = item_keys(region, "TransactWriteItems", request)
        met = STATE.try_hold(STATE.held_items, STATE.forced_items, keys)
        if met:
            for name, _ in set(met):
                STATE.count("transaction_conflicts", name)
            reasons = [{"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
                       if k in met else {"Code": "None"} for k in keys]
            codes = ", ".join(r["Code"] for r in reasons)
            return dynamodb_error(
                start_response, "TransactionCanceledException",
                f"Transaction cancelled, please refer cancellation reasons for specific reasons [{codes}]",
                CancellationReasons=reasons)
        # DynamoDB's own time with the items held; moto then applies the writes in turn (its
        # queue is the emulator's, not a longer transaction, so it holds nothing).
        try:
            time.sleep(STATE.transaction_s)
        finally:
            STATE.release(STATE.held_items, keys)
        status, headers, body = call(self.app, environ)
        if status.startswith("400") and b"Item size" in body:
            # moto refuses the whole request; DynamoDB cancels the transaction, giving the
            # item's reason as ValidationError (which item, moto does not say: all of them).
            message = json.loads(body).get("message", "")
            reasons = [{"Code": "ValidationError", "Message": message} for _ in keys]
            return dynamodb_error(
                start_response, "TransactionCanceledException",
                "Transaction cancelled, please refer cancellation reasons for specific reasons",
                CancellationReasons=reasons)
        return respond(start_response, status, headers, body)

    def stale(self, region, name, ask, key):
        """(True, the item as it was) when an eventually consistent read of `key` may still
        miss recent writes; (False, None) when the read sees the latest."""
        table = table_of(region, name)
        if table is None or ask.get("ConsistentRead"):
            return False, None
        stale, before = STATE.stale_image(name, key_of(table, key), time.monotonic())
        if stale:
            STATE.count("stale_reads", name)
        return stale, before

    def s3(self, environ, start_response):
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items()
                   if k.startswith("HTTP_")}
        for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(name):
                headers[name.replace("_", "-").lower()] = environ[name]
        bucket, _, key = unquote(environ.get("PATH_INFO", "")).lstrip("/").partition("/")
        size = sum(len(k) + len(v.encode("latin-1", "replace")) + 4 for k, v in headers.items())
        if size > HEADER_LIMIT:
            STATE.count("header_refusals", bucket)
            return s3_error(start_response, "400 Bad Request", "RequestHeaderSectionTooLarge",
                            f"Your request header section exceeds the maximum allowed size ({size} bytes).")
        metadata = sum(len(k) - len("x-amz-meta-") + len(v.encode("latin-1", "replace"))
                       for k, v in headers.items() if k.startswith("x-amz-meta-"))
        if metadata > METADATA_LIMIT:
            STATE.count("metadata_refusals", bucket)
            return s3_error(start_response, "400 Bad Request", "MetadataTooLarge",
                            "Your metadata headers exceed the maximum allowed metadata size.")
        conditional = "if-none-match" in headers or "if-match" in headers
        if environ["REQUEST_METHOD"] != "PUT" or not conditional or not key:
            return self.app(environ, start_response)
        return self.conditional_put(bucket, key, environ, start_response)

    def conditional_put(self, bucket, key, environ, start_response):
        held = [(bucket, key)]
        if STATE.try_hold(STATE.held_objects, STATE.forced_objects, held):
            STATE.count("put_conflicts", bucket)
            return s3_error(start_response, "409 Conflict", "ConditionalRequestConflict",
                            "A conflicting conditional operation is currently in progress "
                            "against this resource. Please try again.")
        try:
            time.sleep(STATE.put_s)  # the upload is in flight: it holds its key
        finally:
            STATE.release(STATE.held_objects, held)
        return self.app(environ, start_response)
