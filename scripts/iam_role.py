"""IAM in front of moto: a request signed as one of our roles is checked against what that
role grants, and refused with AccessDenied as AWS would. moto itself checks no IAM.

The role is told by the access key id in the request's signature:
- `conveyor-worker`: the function's role, `WorkerRole` in template.yaml, every statement
  (those under a condition too: the proxies' secret). testkit signs the worker's requests
  with it, so every test that runs the worker runs it under its role.
- `conveyor-ops`: the operator's tool, against docs/conveyor-ops-policy.json, the policy the
  runbook gives its users (`poll` runs the worker on the operator's machine, under it too).
  The tests run the real binary with this key.
- any other key (the tests' own clients, seeding and checking) is not checked.

AWS authorizes each item of a transaction by its own action: a TransactWriteItems needs
PutItem, UpdateItem, DeleteItem or ConditionCheckItem for each of its items, a
TransactGetItems GetItem. An SQS batch needs the action of one message (SendMessageBatch:
SendMessage). A CopyObject needs GetObject (its source) and PutObject. Actions
are checked, not resources: every test has a table and a bucket of its own.

A refusal is counted in the production-like layer's stats (`GET /_prodlike/stats`) as
`denied` {"<table, queue or bucket> <action>": count}, and answered as AWS answers it: 400 AccessDeniedException for the
JSON APIs, 403 AccessDenied for S3.
"""

import json
import os
from urllib.parse import parse_qs

import prodlike

WORKER_KEY = "conveyor-worker"
OPS_KEY = "conveyor-ops"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TEMPLATE = os.path.join(ROOT, "template.yaml")
OPS_POLICY = os.path.join(ROOT, "docs", "conveyor-ops-policy.json")

TRANSACT_ITEM_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}
JSON_TARGETS = {
    "DynamoDB_20120810.": "dynamodb",
    "AmazonSQS.": "sqs",
    "secretsmanager.": "secretsmanager",
}


def role_actions(template_path, role_name):
    """Every action an Allow statement of the role's policies names."""
    from cfnlint.decode import cfn_yaml

    role = cfn_yaml.load(template_path)["Resources"][role_name]["Properties"]
    actions = set()
    for policy in role.get("Policies", []):
        for statement in policy["PolicyDocument"]["Statement"]:
            branches = statement["Fn::If"][1:] if "Fn::If" in statement else [statement]
            for branch in branches:
                if isinstance(branch, dict) and branch.get("Effect") == "Allow":
                    named = branch.get("Action", [])
                    actions.update(named if isinstance(named, list) else [named])
    return actions


def policy_actions(path):
    """Every action an Allow statement of a policy document (JSON) names."""
    with open(path) as f:
        statements = json.load(f)["Statement"]
    actions = set()
    for statement in statements:
        if statement.get("Effect") == "Allow":
            named = statement.get("Action", [])
            actions.update(named if isinstance(named, list) else [named])
    return actions


def access_key(environ):
    # Authorization: AWS4-HMAC-SHA256 Credential=KEY/DATE/REGION/SERVICE/aws4_request, ...
    auth = environ.get("HTTP_AUTHORIZATION", "")
    return auth.split("Credential=", 1)[-1].split("/", 1)[0] if "Credential=" in auth else ""


def dynamodb_actions(operation, environ):
    if operation == "TransactGetItems":
        return ["dynamodb:GetItem"]
    if operation != "TransactWriteItems":
        return [f"dynamodb:{operation}"]
    request = json.loads(prodlike.read_body(environ) or b"{}")
    kinds = {kind for item in request.get("TransactItems", []) for kind in item}
    return sorted(f"dynamodb:{TRANSACT_ITEM_ACTIONS.get(k, k)}" for k in kinds)


def s3_actions(environ):
    method = environ.get("REQUEST_METHOD", "GET")
    path = environ.get("PATH_INFO", "").strip("/")
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    on_object = "/" in path
    if not on_object:
        return {"PUT": ["s3:CreateBucket"], "DELETE": ["s3:DeleteBucket"]}.get(
            method, ["s3:ListBucket"])
    if method in ("GET", "HEAD"):
        return ["s3:GetObject"]
    if method == "DELETE":
        return ["s3:DeleteObject"]
    if method == "PUT" and environ.get("HTTP_X_AMZ_COPY_SOURCE"):
        return ["s3:GetObject", "s3:PutObject"]
    if method == "POST" and "delete" in query:
        return ["s3:DeleteObject"]
    return ["s3:PutObject"]


def actions_of(environ):
    """The IAM actions AWS would authorize for this request."""
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    for prefix, service in JSON_TARGETS.items():
        if target.startswith(prefix):
            operation = target[len(prefix):]
            if service == "dynamodb":
                return dynamodb_actions(operation, environ)
            # SQS authorizes a batch by the action of one: SendMessageBatch is SendMessage.
            return [f"{service}:{operation.removesuffix('Batch')}"]
    _, service = prodlike.region_and_service(environ)
    if service == "s3":
        return s3_actions(environ)
    return [f"{service or 'unknown'}:{target or environ.get('PATH_INFO', '')}"]


def resource_of(environ):
    """The table, queue or bucket a request names (the first, for a transaction)."""
    if prodlike.region_and_service(environ)[1] == "s3":
        return environ.get("PATH_INFO", "").strip("/").split("/", 1)[0]
    request = json.loads(prodlike.read_body(environ) or b"{}")
    if "QueueUrl" in request:
        return request["QueueUrl"].rstrip("/").rsplit("/", 1)[-1]
    for item in request.get("TransactItems", []):
        for op in item.values():
            return op.get("TableName", "")
    return request.get("TableName") or next(iter(request.get("RequestItems", {})), "")


def denied(environ, start_response, key, action):
    resource = resource_of(environ)
    message = f"User: {key} is not authorized to perform: {action} on resource: {resource}"
    prodlike.STATE.count("denied", f"{resource} {action}")
    if prodlike.region_and_service(environ)[1] == "s3":
        return prodlike.s3_error(start_response, "403 Forbidden", "AccessDenied", message)
    body = {"__type": "com.amazon.coral.service#AccessDeniedException", "message": message}
    headers = [("Content-Type", "application/x-amz-json-1.0")]
    return prodlike.respond(start_response, "400 Bad Request", headers,
                            json.dumps(body).encode())


class Enforce:
    """Refuses what the worker's role, or the operator's policy, does not grant; everything
    else goes to `app`."""

    def __init__(self, app, template_path=TEMPLATE, ops_policy=OPS_POLICY):
        self.app = app
        self.granted = {
            WORKER_KEY: role_actions(template_path, "WorkerRole"),
            OPS_KEY: policy_actions(ops_policy),
        }

    def __call__(self, environ, start_response):
        key = access_key(environ)
        granted = self.granted.get(key)
        if granted is None:
            return self.app(environ, start_response)
        for action in actions_of(environ):
            if action not in granted:
                return denied(environ, start_response, key, action)
            prodlike.STATE.count("used", f"{key} {action}")
        return self.app(environ, start_response)
