"""The deployment rules of template.yaml that linters do not check (they do not look inside
SAM event sources or weigh one resource against another). Run by `make test`:

    python tests/template_rules.py template.yaml docs/runbook.md src/wiring/config.rs \
        docs/deploying.md crates/renderer/src/settings.rs

Each rule returns the problems it finds. The template must have none, and each rule must
find its problem in a copy of the template broken on purpose (so no rule passes vacuously).
"""

import copy
import json
import re
import sys

from cfnlint.decode import cfn_yaml

MIN_RECEIVES = 5
FOURTEEN_DAYS = 1_209_600
# Variables for the process rather than the worker's configuration.
RUNTIME_VARIABLES = {"MALLOC_MMAP_THRESHOLD_", "RUST_LOG"}
OUTPUTS_THE_RUNBOOK_USES = ["TasksQueueUrl", "DeadLetterQueueUrl", "DeadLetterQueueArn",
                            "TableName", "BucketName", "DashboardUrl"]
TRACING_LEVELS = {"trace", "debug", "info", "warn", "error"}
# What the dashboard must show: (namespace, metric).
DASHBOARD_METRICS = [
    ("AWS/SQS", "ApproximateNumberOfMessagesVisible"),
    ("AWS/SQS", "ApproximateAgeOfOldestMessage"),
    ("conveyor", "Succeeded"), ("conveyor", "Retried"), ("conveyor", "FailedPermanently"),
    ("conveyor", "Poison"), ("conveyor", "Conflicts"), ("conveyor", "FetchLatency"),
    ("AWS/Lambda", "Errors"), ("AWS/Lambda", "Throttles"), ("AWS/Lambda", "Duration"),
    ("AWS/Lambda", "ConcurrentExecutions"),
    ("conveyor", "Renders"), ("conveyor", "BrowserLaunches"), ("conveyor", "BrowserProxyRefused"),
]


def of_type(template, kind):
    return {name: r for name, r in template["Resources"].items() if r["Type"] == kind}


def props(resource):
    return resource.get("Properties", {})


def sqs_events(template):
    """Each SQS event source mapping with its function (a SAM event, or a mapping resource)."""
    functions = of_type(template, "AWS::Serverless::Function")
    for function in functions.values():
        for event in props(function).get("Events", {}).values():
            if event["Type"] == "SQS":
                yield function, props(event)
    for mapping in of_type(template, "AWS::Lambda::EventSourceMapping").values():
        target = props(mapping).get("FunctionName", {}).get("Ref")
        if target in functions:
            yield functions[target], props(mapping)


def either(value):
    """Both branches of an `Fn::If` (each as it is, AWS::NoValue as None), or the value."""
    if isinstance(value, dict) and "Fn::If" in value:
        return [None if b == {"Ref": "AWS::NoValue"} else b for b in value["Fn::If"][1:]]
    return [value]


def allowed(template, parameter):
    return [int(v) for v in template["Parameters"][parameter]["AllowedValues"]]


def parameter_values(template, value):
    """The values a property may take: a parameter's allowed values, or the literal."""
    if isinstance(value, dict) and "Ref" in value:
        return allowed(template, value["Ref"])
    return [int(value)]


def consumed_queue(event):
    """The queue resource an event source reads (its EventSourceArn's GetAtt)."""
    return event.get("EventSourceArn", {}).get("Fn::GetAtt", [None])[0]


def visibility_covers_six_timeouts_and_the_window(template, _):
    """Each queue a function consumes hides a message for 6 x the function's timeout plus the
    batching window, for every value those parameters allow."""
    problems = []
    events = list(sqs_events(template))
    if not events:
        problems.append("no SQS event source")
    for function, event in events:
        timeout = props(function).get("Timeout")
        window = event.get("MaximumBatchingWindowInSeconds", 0)
        queue = props(template["Resources"].get(consumed_queue(event), {}))
        expected = {"Fn::FindInMap": ["VisibilityTimeout", timeout,
                                      window if isinstance(window, dict) else str(window)]}
        if queue.get("VisibilityTimeout") != expected:
            problems.append(f"{consumed_queue(event)} VisibilityTimeout is "
                            f"{queue.get('VisibilityTimeout')}, not {expected}")
        table = template["Mappings"]["VisibilityTimeout"]
        for seconds in parameter_values(template, timeout):
            for waits in parameter_values(template, window):
                got = table.get(str(seconds), {}).get(str(waits))
                if got is None or int(got) < 6 * seconds + waits:
                    problems.append(f"visibility {got} for timeout {seconds} s, window {waits} s")
    worker = props(template["Resources"]["WorkerFunction"])
    if worker.get("Timeout") != {"Ref": "Timeout"}:
        problems.append("the worker's Timeout is not the Timeout parameter")
    return problems


def event_source_reports_batch_item_failures(template, _):
    problems = []
    events = list(sqs_events(template))
    if not events:
        problems.append("no SQS event source")
    for _, event in events:
        if "ReportBatchItemFailures" not in event.get("FunctionResponseTypes", []):
            problems.append("an SQS event source without ReportBatchItemFailures")
        # Every branch bounds the fleet: a MaximumConcurrency, or provisioned pollers.
        scaling = either(event.get("ScalingConfig"))
        pollers = either(event.get("ProvisionedPollerConfig"))
        for scaled, polled in zip(scaling, pollers + [None] * (len(scaling) - len(pollers))):
            if not (scaled or {}).get("MaximumConcurrency") and not (polled or {}).get(
                "MaximumPollers"
            ):
                problems.append("an SQS event source without MaximumConcurrency or pollers")
        if "BatchSize" not in event:
            problems.append("an SQS event source without BatchSize")
    sizes = template["Parameters"]["BatchSize"]["AllowedValues"]
    if any(int(s) > 10 for s in sizes) and "BatchesOverTenNeedAWindow" not in template.get(
        "Rules", {}
    ):
        problems.append("batch sizes over 10 are allowed without a rule asking for a window")
    return problems


def dead_letter_queue_keeps_repeat_failures(template, _):
    """Each queue a function consumes redrives to a dead-letter queue that keeps messages 14
    days, after more receives than a task has attempts."""
    problems = []
    for _, event in sqs_events(template):
        name = consumed_queue(event)
        redrive = props(template["Resources"][name]).get("RedrivePolicy", {})
        receives = int(redrive.get("maxReceiveCount", 0))
        if receives < MIN_RECEIVES:
            problems.append(f"{name}: maxReceiveCount {receives} < {MIN_RECEIVES}")
        target = redrive.get("deadLetterTargetArn", {}).get("Fn::GetAtt", [None])[0]
        if target not in template["Resources"]:
            problems.append(f"{name} does not redrive to a dead-letter queue")
            continue
        dlq = props(template["Resources"][target])
        if int(dlq.get("MessageRetentionPeriod", 0)) != FOURTEEN_DAYS:
            problems.append(f"the dead-letter queue {target} does not keep messages 14 days")
        if int(template["Parameters"]["MaxAttempts"]["MaxValue"]) > receives:
            problems.append(f"MaxAttempts may exceed {name}'s maxReceiveCount: the last attempt"
                            " would be lost")
    return problems


def everything_is_encrypted_and_private(template, _):
    problems = []
    for name, queue in of_type(template, "AWS::SQS::Queue").items():
        if not (props(queue).get("SqsManagedSseEnabled") or props(queue).get("KmsMasterKeyId")):
            problems.append(f"queue {name} is not encrypted")
    for name, table in of_type(template, "AWS::DynamoDB::Table").items():
        if not props(table).get("SSESpecification", {}).get("SSEEnabled"):
            problems.append(f"table {name} does not say SSEEnabled")
    for name, bucket in of_type(template, "AWS::S3::Bucket").items():
        if not props(bucket).get("BucketEncryption"):
            problems.append(f"bucket {name} has no default encryption")
        block = props(bucket).get("PublicAccessBlockConfiguration", {})
        for setting in ["BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls",
                        "RestrictPublicBuckets"]:
            if block.get(setting) is not True:
                problems.append(f"bucket {name} does not set {setting}")
    for name, topic in of_type(template, "AWS::SNS::Topic").items():
        if not props(topic).get("KmsMasterKeyId"):
            problems.append(f"topic {name} is not encrypted")
    return problems


def statements(role):
    """A role's statements, each with the condition it is granted under (None: always);
    a statement under `!If` counts in each branch that grants one."""
    for policy in props(role).get("Policies", []):
        for statement in policy["PolicyDocument"]["Statement"]:
            if "Fn::If" in statement:
                condition, *branches = statement["Fn::If"]
                for branch in branches:
                    if isinstance(branch, dict) and "Effect" in branch:
                        yield condition, branch
            else:
                yield None, statement


XRAY_WRITES = {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}


def least_privilege(template, _):
    problems = []
    for name, function in of_type(template, "AWS::Serverless::Function").items():
        if "Role" not in props(function) or "Policies" in props(function):
            problems.append(f"function {name} does not use the explicit role alone")
    for name, role in of_type(template, "AWS::IAM::Role").items():
        if props(role).get("ManagedPolicyArns"):
            problems.append(f"role {name} attaches managed policies")
        for condition, statement in statements(role):
            sid = statement.get("Sid", "?")
            actions = statement.get("Action", [])
            actions = actions if isinstance(actions, list) else [actions]
            if "NotAction" in statement or "NotResource" in statement:
                problems.append(f"{name}/{sid} uses NotAction or NotResource")
            if any("*" in a for a in actions):
                problems.append(f"{name}/{sid} has a wildcard action")
            resources = statement.get("Resource")
            resources = resources if isinstance(resources, list) else [resources]
            # X-Ray's write actions name no resource: IAM takes them only on "*".
            traces = set(actions) <= XRAY_WRITES and condition == "UseCollectorLayer"
            if any(r == "*" or r == "arn:aws:*" for r in resources) and not traces:
                problems.append(f"{name}/{sid} applies to every resource")
    return problems


PROXY_SECRET = {"Fn::If": ["CreateProxySecret", {"Ref": "ProxySecret"},
                           {"Fn::Sub": "${ProxySecretArn}"}]}


def the_proxy_secret_alone_is_readable(template, _):
    """Secrets Manager: GetSecretValue of the proxies' secret, only with proxies on, and
    that secret is the one the function is told to read."""
    problems = []
    granted = [(condition, statement)
               for role in of_type(template, "AWS::IAM::Role").values()
               for condition, statement in statements(role)
               if "secretsmanager" in json.dumps(statement.get("Action"))]
    if len(granted) != 1:
        problems.append(f"{len(granted)} statements grant Secrets Manager, not one")
    for condition, statement in granted:
        if statement.get("Action") != "secretsmanager:GetSecretValue":
            problems.append(f"Secrets Manager actions {statement.get('Action')}")
        if condition != "UseProxies":
            problems.append("the proxy secret is readable without proxies")
        if statement.get("Resource") != PROXY_SECRET:
            problems.append(f"readable secrets: {statement.get('Resource')}")
    variables = props(template["Resources"]["WorkerFunction"])["Environment"]["Variables"]
    told = variables.get("PROXY_SECRET_ARN", {}).get("Fn::If", [None, None])[1]
    if told != PROXY_SECRET:
        problems.append(f"the function reads {told}, not the secret it may read")
    return problems


def alarms_cover_what_an_operator_must_know(template, _):
    problems = []
    alarms = of_type(template, "AWS::CloudWatch::Alarm").values()
    needed = [
        ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "TasksDeadLetterQueue"),
        ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "RenderDeadLetterQueue"),
        ("AWS/SQS", "ApproximateAgeOfOldestMessage", "TasksQueue"),
        ("AWS/Lambda", "Errors", "WorkerFunction"),
        ("AWS/Lambda", "Errors", "RendererFunction"),
        ("AWS/Lambda", "Throttles", "WorkerFunction"),
    ]
    for namespace, metric, target in needed:
        watching = [a for a in alarms
                    if (props(a).get("Namespace"), props(a).get("MetricName")) == (namespace, metric)
                    and target in str(props(a).get("Dimensions"))]
        if not watching:
            problems.append(f"no {namespace} {metric} alarm watches {target}")
            continue
        if not all(props(a).get("AlarmActions") for a in watching):
            problems.append(f"the {metric} alarm on {target} notifies nobody")
    return problems


def outputs_feed_the_runbook(template, runbook):
    outputs = template.get("Outputs", {})
    return [f"output {name} is missing" if name not in outputs
            else f"the runbook (docs/runbook.md) does not use output {name}"
            for name in OUTPUTS_THE_RUNBOOK_USES
            if name not in outputs or name not in runbook]


def function_settings_are_ones_the_worker_reads(template, config_rs):
    problems = []
    for name, function in of_type(template, "AWS::Serverless::Function").items():
        for variable in props(function).get("Environment", {}).get("Variables", {}):
            if variable not in RUNTIME_VARIABLES and f'"{variable}"' not in config_rs:
                problems.append(f"function {name} sets {variable}, which config.rs never reads")
    return problems


def documented_parameters(deploying):
    """The parameters deploying.md's table names: each row's first cell, one or more names
    in backticks."""
    table = deploying.split("## Parameters", 1)[-1].split("\n## ", 1)[0]
    names = set()
    for line in table.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and "`" in cells[1]:
            names.update(re.findall(r"`([A-Za-z]+)`", cells[1]))
    return names


def parameters_are_documented(template, deploying):
    """Every parameter of the template has its row in docs/deploying.md, and every row names
    a parameter the template has."""
    parameters = set(template.get("Parameters", {}))
    documented = documented_parameters(deploying)
    return ([f"parameter {name} has no row in docs/deploying.md"
             for name in sorted(parameters - documented)]
            + [f"docs/deploying.md names {name}, which the template does not take"
               for name in sorted(documented - parameters)])


def constant(config_rs, name):
    """A `const NAME: u64 = a * b * c;` of config.rs, evaluated."""
    found = re.search(rf"const {name}: u64 = ([0-9_ *]+);", config_rs)
    product = 1
    for factor in found.group(1).replace("_", "").split("*"):
        product *= int(factor)
    return product


def memory_holds_the_records_in_flight(template, config_rs):
    """With the defaults, MemorySize holds RecordConcurrency bodies of MaxBodyBytes beside the
    process (the worker's own sizes, from config.rs); other choices are lowered at cold
    start by the worker, so the defaults must never be."""
    params = template["Parameters"]
    memory = int(params["MemorySize"]["Default"]) * 1024 * 1024
    concurrency = int(params["RecordConcurrency"]["Default"])
    body = int(params["MaxBodyBytes"]["Default"])
    need = constant(config_rs, "PROCESS_BYTES") + concurrency * (
        body + constant(config_rs, "RECORD_OVERHEAD_BYTES"))
    # Traces on, to the collector layer: it shares the sandbox's memory.
    if params["Tracing"]["Default"] == "On" and not params["OtlpEndpoint"]["Default"]:
        need += constant(config_rs, "COLLECTOR_BYTES")
    problems = []
    if memory < need:
        problems.append(f"MemorySize {memory >> 20} MB < {need >> 20} MB needed by "
                        f"{concurrency} records of {body} bytes")
    variables = of_type(template, "AWS::Serverless::Function")["WorkerFunction"]
    variables = props(variables)["Environment"]["Variables"]
    if variables.get("MAX_BODY_BYTES") != {"Ref": "MaxBodyBytes"}:
        problems.append("MAX_BODY_BYTES is not the MaxBodyBytes parameter")
    return problems


def metrics_survive_every_log_level(template, _):
    """The metric lines (EMF documents, no level) count as INFO to Lambda's log filter: Lambda
    must filter nothing (TRACE), and the worker filter its own logs by LogLevel (RUST_LOG),
    every allowed LogLevel being one of tracing's levels."""
    problems = []
    for name, function in of_type(template, "AWS::Serverless::Function").items():
        logging = props(function).get("LoggingConfig", {})
        if logging.get("ApplicationLogLevel") != "TRACE":
            problems.append(f"{name}'s ApplicationLogLevel is {logging.get('ApplicationLogLevel')},"
                            " not TRACE: Lambda would drop the metric lines at WARN and above")
        rust_log = props(function)["Environment"]["Variables"].get("RUST_LOG")
        if rust_log != {"Fn::FindInMap": ["LogFilter", {"Ref": "LogLevel"}, "Filter"]}:
            problems.append(f"{name}'s RUST_LOG is not the LogLevel parameter's filter")
    filters = template["Mappings"].get("LogFilter", {})
    for level in template["Parameters"]["LogLevel"]["AllowedValues"]:
        if filters.get(level, {}).get("Filter") not in TRACING_LEVELS:
            problems.append(f"LogLevel {level} is not a tracing level")
    return problems


def a_dashboard_shows_what_the_runbook_watches(template, _):
    problems = []
    dashboards = of_type(template, "AWS::CloudWatch::Dashboard")
    if not dashboards:
        return ["no dashboard"]
    for name, dashboard in dashboards.items():
        body = props(dashboard)["DashboardBody"]
        text = body["Fn::Sub"][0] if isinstance(body["Fn::Sub"], list) else body["Fn::Sub"]
        try:
            widgets = json.loads(re.sub(r"\$\{[^}]+\}", "x", text))["widgets"]
        except (ValueError, KeyError) as err:
            problems.append(f"dashboard {name} is not a dashboard body: {err}")
            continue
        shown = {(m[0], m[1]) for w in widgets for m in w["properties"].get("metrics", [])}
        problems += [f"dashboard {name} does not show {namespace} {metric}"
                     for namespace, metric in DASHBOARD_METRICS
                     if (namespace, metric) not in shown]
    return problems


def sam_builds_the_worker_for_arm64(template, _):
    """`sam build` builds the functions itself (cargo lambda, the worker's binary; the
    renderer's image from its Dockerfile), for the architecture they run on."""
    function = template["Resources"]["WorkerFunction"]
    problems = []
    metadata = function.get("Metadata", {})
    if metadata.get("BuildMethod") != "rust-cargolambda":
        problems.append("WorkerFunction has no BuildMethod rust-cargolambda: sam build builds nothing")
    if metadata.get("BuildProperties", {}).get("Binary") != "conveyor-worker":
        problems.append("sam build is not told which binary is the function (conveyor-worker)")
    if props(function).get("CodeUri") != ".":
        problems.append("CodeUri is not the project, whose Cargo.toml sam build reads")
    if props(function).get("Architectures") != ["arm64"]:
        problems.append("the function is not arm64, what `make build` checks the package for")
    renderer = template["Resources"]["RendererFunction"]
    if props(renderer).get("PackageType") != "Image":
        problems.append("the renderer is not an image: Chromium is over a zip's 250 MB")
    if renderer.get("Metadata", {}).get("Dockerfile") != "crates/renderer/Dockerfile":
        problems.append("sam build is not told the renderer's Dockerfile")
    if props(renderer).get("Architectures") != ["arm64"]:
        problems.append("the renderer is not arm64, the architecture its image is built for")
    return problems


RULES = [
    visibility_covers_six_timeouts_and_the_window,
    event_source_reports_batch_item_failures,
    dead_letter_queue_keeps_repeat_failures,
    everything_is_encrypted_and_private,
    least_privilege,
    the_proxy_secret_alone_is_readable,
    alarms_cover_what_an_operator_must_know,
    outputs_feed_the_runbook,
    function_settings_are_ones_the_worker_reads,
    memory_holds_the_records_in_flight,
    metrics_survive_every_log_level,
    a_dashboard_shows_what_the_runbook_watches,
    sam_builds_the_worker_for_arm64,
    parameters_are_documented,
]


def broken(template, change):
    """A deep copy of the template with one thing broken."""
    t = copy.deepcopy(template)
    change(t)
    return t


def resource(t, name):
    return t["Resources"][name]["Properties"]


def first_event(t):
    return resource(t, "TasksEventSource")


def first_statement(t):
    return resource(t, "WorkerRole")["Policies"][0]["PolicyDocument"]["Statement"][1]


def proxy_statement(t):
    listed = resource(t, "WorkerRole")["Policies"][0]["PolicyDocument"]["Statement"]
    return next(s["Fn::If"][1] for s in listed if "Fn::If" in s)


# One breakage per rule, each of a kind the rule exists to catch.
BREAKAGES = {
    visibility_covers_six_timeouts_and_the_window:
        lambda t: t["Mappings"]["VisibilityTimeout"]["900"].__setitem__("300", 5400),
    event_source_reports_batch_item_failures:
        lambda t: first_event(t).pop("FunctionResponseTypes"),
    dead_letter_queue_keeps_repeat_failures:
        lambda t: resource(t, "TasksQueue")["RedrivePolicy"].__setitem__("maxReceiveCount", 3),
    everything_is_encrypted_and_private:
        lambda t: resource(t, "TasksDeadLetterQueue").pop("SqsManagedSseEnabled"),
    least_privilege:
        lambda t: first_statement(t).__setitem__("Action", "sqs:*"),
    the_proxy_secret_alone_is_readable:
        lambda t: proxy_statement(t).__setitem__(
            "Resource", {"Fn::Sub": "arn:${AWS::Partition}:secretsmanager:*"}),
    alarms_cover_what_an_operator_must_know:
        lambda t: t["Resources"].pop("OldestMessageAgeAlarm"),
    outputs_feed_the_runbook:
        lambda t: t["Outputs"].pop("DeadLetterQueueUrl"),
    function_settings_are_ones_the_worker_reads:
        lambda t: resource(t, "WorkerFunction")["Environment"]["Variables"].__setitem__(
            "TABLE", "x"),
    memory_holds_the_records_in_flight:
        lambda t: t["Parameters"]["RecordConcurrency"].__setitem__("Default", 64),
    metrics_survive_every_log_level:
        lambda t: resource(t, "WorkerFunction")["LoggingConfig"].__setitem__(
            "ApplicationLogLevel", {"Ref": "LogLevel"}),
    sam_builds_the_worker_for_arm64:
        lambda t: t["Resources"]["WorkerFunction"].pop("Metadata"),
    parameters_are_documented:
        lambda t: t["Parameters"].__setitem__("Undocumented", {"Type": "String"}),
    a_dashboard_shows_what_the_runbook_watches:
        lambda t: resource(t, "Dashboard")["DashboardBody"]["Fn::Sub"].__setitem__(
            0, resource(t, "Dashboard")["DashboardBody"]["Fn::Sub"][0].replace(
                "FetchLatency", "Latency")),
}


def main(template_path, runbook_path, config_path, deploying_path, *more_settings):
    template = cfn_yaml.load(template_path)
    runbook = open(runbook_path, encoding="utf-8").read()
    config_rs = open(config_path, encoding="utf-8").read()
    # The renderer's own settings are read beside the worker's (crates/renderer/src/settings.rs).
    settings_rs = config_rs + "".join(open(p, encoding="utf-8").read() for p in more_settings)
    deploying = open(deploying_path, encoding="utf-8").read()
    context = {
        parameters_are_documented: deploying,
        outputs_feed_the_runbook: runbook,
        function_settings_are_ones_the_worker_reads: settings_rs,
        memory_holds_the_records_in_flight: config_rs,
    }
    failures = 0
    for rule in RULES:
        problems = rule(template, context.get(rule))
        caught = rule(broken(template, BREAKAGES[rule]), context.get(rule))
        verdict = "ok" if not problems and caught else "FAILED"
        failures += verdict != "ok"
        print(f"template rule {rule.__name__} ... {verdict}")
        for problem in problems:
            print(f"  {problem}")
        if not caught:
            print("  did not catch its deliberate breakage")
    print(f"template rules: {len(RULES) - failures} passed; {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
