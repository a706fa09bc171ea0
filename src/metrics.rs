//! Metrics in CloudWatch Embedded Metric Format (EMF): what one invocation did, as one JSON
//! document on stdout, which CloudWatch Logs turns into metrics.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::contract::{Outcome, Reply};
use crate::domain::spend::{MAX_TIERS, Spend};

/// EMF caps the values of one metric in one document.
pub const MAX_VALUES_PER_METRIC: usize = 100;

/// Where the metrics go: namespace, and the `Service` dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    pub namespace: String,
    pub service: String,
}

/// Measures taken while records run, shared by the records of one invocation.
#[derive(Debug, Default)]
pub struct Measures {
    fetch_ms: Mutex<Vec<f64>>,
    bytes_stored: AtomicU64,
    /// Stored pages that were application shells (`domain::shells`).
    shells: AtomicU64,
    /// Pages not modified (`304`), and the bytes of the earlier results carried forward.
    not_modified: AtomicU64,
    bytes_not_fetched: AtomicU64,
    /// Writes that met a concurrent change and were tried again (`pushback::retry::Patience`).
    pub conflicts: AtomicU64,
    pub polite: PoliteMeasures,
    /// Requests and bytes through each proxy tier (task fetches and robots.txt alike).
    spend: Mutex<Spend>,
}

/// What politeness did in one invocation (`polite::Gate`).
#[derive(Debug, Default)]
pub struct PoliteMeasures {
    /// Time slept waiting for a host's schedule inside the invocation.
    pub slept_ms: AtomicU64,
    /// Fetches whose answer was trouble for the fleet to record: a push-back, a failure, or
    /// an answer time that says the site is queueing our requests (`domain::health`).
    pub cooldowns: AtomicU64,
    /// robots.txt fetched for the fleet.
    pub robots_fetches: AtomicU64,
    /// URLs robots.txt forbids (their tasks failed).
    pub robots_disallowed: AtomicU64,
    /// Bytes robots.txt fetches spent on the paid proxy tier (the fleet's, no run's).
    pub robots_paid_bytes: AtomicU64,
}

impl Measures {
    /// One fetch, whatever its result, took this long.
    pub fn fetched(&self, took: Duration) {
        let mut all = self.fetch_ms.lock().unwrap_or_else(PoisonError::into_inner);
        all.push(took.as_secs_f64() * 1000.0);
    }

    /// A result object of this size was stored.
    pub fn stored(&self, bytes: u64) {
        self.bytes_stored.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A stored page was an application shell.
    pub fn shell_stored(&self) {
        self.shells.fetch_add(1, Ordering::Relaxed);
    }

    /// A page was not modified: its earlier result of this size was carried forward.
    pub fn not_modified(&self, bytes: u64) {
        self.not_modified.fetch_add(1, Ordering::Relaxed);
        self.bytes_not_fetched.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A fetch spent this through proxies.
    pub fn spent(&self, spend: &Spend) {
        let mut all = self.spend.lock().unwrap_or_else(PoisonError::into_inner);
        *all = all.plus(spend);
    }
}

/// The metrics of each proxy tier, by tier (static names, as EMF wants them).
const TIER_METRICS: [(&str, &str, &str); MAX_TIERS] = [
    (
        "ProxyRequestsTier1",
        "ProxyBytesTier1",
        "ProxyWireBytesTier1",
    ),
    (
        "ProxyRequestsTier2",
        "ProxyBytesTier2",
        "ProxyWireBytesTier2",
    ),
    (
        "ProxyRequestsTier3",
        "ProxyBytesTier3",
        "ProxyWireBytesTier3",
    ),
    (
        "ProxyRequestsTier4",
        "ProxyBytesTier4",
        "ProxyWireBytesTier4",
    ),
];

/// What one invocation did, by the ack contract.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    pub records: u64,
    /// Acknowledged: this delivery made the task's successful terminal write.
    pub succeeded: u64,
    /// Acknowledged without work: the task was already terminal, or another delivery won.
    pub duplicate_guarded: u64,
    /// Acknowledged: the body can never name a task (kept in the quarantine).
    pub poison: u64,
    /// Acknowledged: the task, its job or its run no longer wants work.
    pub not_wanted: u64,
    /// Acknowledged: the task failed for good (permanent failure, or out of attempts).
    pub failed: u64,
    /// Acknowledged: the task was sent on to the renderer's queue.
    pub handed_over: u64,
    /// Reported in `batchItemFailures`, to come back.
    pub retried: u64,
    pub fetch_ms: Vec<f64>,
    pub bytes_stored: u64,
    /// Stored pages that were application shells: their content needs a browser.
    pub shells_stored: u64,
    /// Pages a site said were not modified (`304`), whose earlier results were carried
    /// forward, and those results' bytes. That is what was not fetched again.
    pub not_modified: u64,
    pub bytes_not_fetched: u64,
    /// Writes that met a concurrent change (a DynamoDB transaction in flight on the same
    /// item, S3's 409) and were tried again.
    pub conflicts: u64,
    /// Records whose host had no room, held back without using an attempt
    /// (`Outcome::WaitCopied`, `Outcome::WaitHeld`).
    pub polite_holds: u64,
    pub polite_slept_ms: u64,
    pub host_cooldowns: u64,
    pub robots_fetches: u64,
    pub robots_disallowed: u64,
    pub robots_paid_bytes: u64,
    /// Requests and body bytes through each proxy tier.
    pub spend: Spend,
    /// Spans the trace exporter could not send since the last invocation's metrics (it
    /// sends after each reply, so a failed export shows in the next invocation's).
    pub trace_spans_dropped: u64,
    /// The processor's own measures (the renderer's browser): (name, unit, value).
    pub own: Vec<(&'static str, &'static str, u64)>,
}

impl Tally {
    /// The tally of these outcomes and measures.
    pub fn of(outcomes: &[Outcome], measures: Measures) -> Self {
        let mut tally = Tally {
            records: outcomes.len() as u64,
            fetch_ms: measures
                .fetch_ms
                .into_inner()
                .unwrap_or_else(PoisonError::into_inner),
            bytes_stored: measures.bytes_stored.into_inner(),
            shells_stored: measures.shells.into_inner(),
            not_modified: measures.not_modified.into_inner(),
            bytes_not_fetched: measures.bytes_not_fetched.into_inner(),
            conflicts: measures.conflicts.into_inner(),
            polite_slept_ms: measures.polite.slept_ms.into_inner(),
            host_cooldowns: measures.polite.cooldowns.into_inner(),
            robots_fetches: measures.polite.robots_fetches.into_inner(),
            robots_disallowed: measures.polite.robots_disallowed.into_inner(),
            robots_paid_bytes: measures.polite.robots_paid_bytes.into_inner(),
            spend: measures
                .spend
                .into_inner()
                .unwrap_or_else(PoisonError::into_inner),
            ..Tally::default()
        };
        for outcome in outcomes {
            *tally.counter(outcome) += 1;
        }
        tally
    }

    /// The one counter an outcome adds to.
    fn counter(&mut self, outcome: &Outcome) -> &mut u64 {
        if matches!(
            outcome,
            Outcome::WaitCopied { .. } | Outcome::WaitHeld { .. }
        ) {
            return &mut self.polite_holds;
        }
        // A final attempt sent again as a copy is a retry, whatever SQS is told of it.
        if outcome.reply() == Reply::Retry || matches!(outcome, Outcome::SentAgain { .. }) {
            return &mut self.retried;
        }
        match outcome {
            Outcome::Succeeded { .. } => &mut self.succeeded,
            Outcome::AlreadyTerminal | Outcome::LostRace => &mut self.duplicate_guarded,
            Outcome::Poison(_) => &mut self.poison,
            Outcome::NotWanted(_) => &mut self.not_wanted,
            Outcome::HandedOver { .. } => &mut self.handed_over,
            _ => &mut self.failed,
        }
    }

    /// The EMF documents. There is one, unless more fetches were timed than EMF takes in one
    /// metric. Then the rest of the latencies follow in documents of their own.
    pub fn documents(
        &self,
        settings: &MetricsSettings,
        request_id: &str,
        at: SystemTime,
    ) -> Vec<Value> {
        let counts = [
            ("Records", self.records),
            ("Succeeded", self.succeeded),
            ("DuplicateGuarded", self.duplicate_guarded),
            ("Poison", self.poison),
            ("NotWanted", self.not_wanted),
            ("FailedPermanently", self.failed),
            ("HandedOver", self.handed_over),
            ("Retried", self.retried),
            ("Conflicts", self.conflicts),
            ("PoliteHolds", self.polite_holds),
            ("HostCooldowns", self.host_cooldowns),
            ("RobotsFetches", self.robots_fetches),
            ("RobotsDisallowed", self.robots_disallowed),
            ("NotModified", self.not_modified),
            ("ShellsStored", self.shells_stored),
            ("TraceSpansDropped", self.trace_spans_dropped),
        ];
        let mut first = vec![
            ("BytesStored", "Bytes", json!(self.bytes_stored)),
            ("BytesNotFetched", "Bytes", json!(self.bytes_not_fetched)),
            ("PoliteWait", "Milliseconds", json!(self.polite_slept_ms)),
            ("RobotsPaidBytes", "Bytes", json!(self.robots_paid_bytes)),
        ];
        first.extend(counts.map(|(name, n)| (name, "Count", json!(n))));
        for (tier, spend) in self.spend.spent() {
            // `spent` yields tiers 1 to MAX_TIERS: always an index of the table.
            let (requests, bytes, wire) = TIER_METRICS[tier - 1];
            first.push((requests, "Count", json!(spend.requests)));
            first.push((bytes, "Bytes", json!(spend.bytes)));
            first.push((wire, "Bytes", json!(spend.wire_bytes)));
        }
        first.push(("Blocked", "Count", json!(self.spend.blocks())));
        first.extend(
            self.own
                .iter()
                .map(|(name, unit, n)| (*name, *unit, json!(n))),
        );
        let mut latencies = self.fetch_ms.chunks(MAX_VALUES_PER_METRIC);
        if let Some(chunk) = latencies.next() {
            first.push(("FetchLatency", "Milliseconds", json!(chunk)));
        }
        let mut documents = vec![document(settings, request_id, at, &first)];
        for chunk in latencies {
            let rest = [("FetchLatency", "Milliseconds", json!(chunk))];
            documents.push(document(settings, request_id, at, &rest));
        }
        documents
    }
}

/// One EMF document: the metrics, the `Service` dimension, and the request id as a
/// property (searchable in Logs Insights, not a dimension).
fn document(
    settings: &MetricsSettings,
    request_id: &str,
    at: SystemTime,
    metrics: &[(&str, &str, Value)],
) -> Value {
    let timestamp = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let definitions: Vec<Value> = metrics
        .iter()
        .map(|(name, unit, _)| json!({ "Name": name, "Unit": unit }))
        .collect();
    let mut root = Map::new();
    root.insert(
        "_aws".into(),
        json!({
            "Timestamp": timestamp,
            "CloudWatchMetrics": [{
                "Namespace": settings.namespace,
                "Dimensions": [["Service"]],
                "Metrics": definitions,
            }],
        }),
    );
    root.insert("Service".into(), json!(settings.service));
    root.insert("requestId".into(), json!(request_id));
    for (name, _, value) in metrics {
        root.insert((*name).into(), value.clone());
    }
    Value::Object(root)
}

/// Writes the documents, one line each, in a single write, so no other log line lands
/// inside one.
pub fn emit(out: &mut impl Write, documents: &[Value]) -> std::io::Result<()> {
    let mut lines = Vec::new();
    for document in documents {
        serde_json::to_writer(&mut lines, document)?;
        lines.push(b'\n');
    }
    out.write_all(&lines)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{NotWanted, WaitFor};
    use crate::domain::message::Poison;
    use crate::domain::spend::TierSpend;

    fn settings() -> MetricsSettings {
        MetricsSettings {
            namespace: "conveyor".into(),
            service: "conveyor-worker".into(),
        }
    }

    /// The EMF specification's rules for a document, as problems found.
    fn emf_problems(doc: &Value) -> Vec<String> {
        let mut problems = Vec::new();
        let Some(aws) = doc.get("_aws") else {
            return vec!["no _aws member".into()];
        };
        if !aws["Timestamp"].is_u64() {
            problems.push("Timestamp is not a whole number of milliseconds".into());
        }
        let Some(directives) = aws["CloudWatchMetrics"].as_array() else {
            return vec!["CloudWatchMetrics is not an array".into()];
        };
        for directive in directives {
            let namespace = directive["Namespace"].as_str().unwrap_or_default();
            if namespace.is_empty() || namespace.len() > 255 {
                problems.push(format!("namespace {namespace:?}"));
            }
            for set in directive["Dimensions"].as_array().into_iter().flatten() {
                let names = set.as_array().cloned().unwrap_or_default();
                if names.len() > 30 {
                    problems.push("a dimension set of more than 30".into());
                }
                for name in names {
                    let value = name.as_str().and_then(|n| doc.get(n));
                    if !value.is_some_and(Value::is_string) {
                        problems.push(format!("dimension {name} has no string value"));
                    }
                }
            }
            let metrics = directive["Metrics"].as_array().cloned().unwrap_or_default();
            if metrics.len() > 100 {
                problems.push("more than 100 metrics".into());
            }
            for metric in metrics {
                let name = metric["Name"].as_str().unwrap_or_default();
                let units = ["Count", "Milliseconds", "Bytes"];
                if !units.contains(&metric["Unit"].as_str().unwrap_or_default()) {
                    problems.push(format!("{name}: unit {}", metric["Unit"]));
                }
                match doc.get(name) {
                    Some(Value::Number(_)) => {}
                    Some(Value::Array(values))
                        if !values.is_empty()
                            && values.len() <= MAX_VALUES_PER_METRIC
                            && values.iter().all(Value::is_number) => {}
                    other => problems.push(format!("{name}: value {other:?}")),
                }
            }
        }
        problems
    }

    #[test]
    fn outcomes_are_counted_by_how_they_were_acknowledged() {
        let outcomes = [
            Outcome::Succeeded {
                redelivery: false,
                adopted: false,
            },
            Outcome::Succeeded {
                redelivery: true,
                adopted: true,
            },
            Outcome::AlreadyTerminal,
            Outcome::LostRace,
            Outcome::Poison(Poison("not JSON".into())),
            Outcome::NotWanted(NotWanted::JobNotActive),
            Outcome::FailedPermanently {
                reason: "HTTP 404".into(),
            },
            Outcome::GaveUp {
                reason: "HTTP 503".into(),
            },
            Outcome::GroupHeld,
            Outcome::OutOfTime,
            Outcome::WaitCopied {
                delay: Duration::from_secs(3),
            },
            Outcome::WaitHeld {
                delay: Duration::from_secs(3),
                booked: None,
                waits_for: WaitFor::Host,
            },
            Outcome::HandedOver {
                reason: "always".into(),
            },
        ];
        let measures = Measures::default();
        measures.fetched(Duration::from_millis(120));
        measures.stored(36);
        measures.shell_stored();
        measures.conflicts.fetch_add(3, Ordering::Relaxed);
        measures.polite.slept_ms.fetch_add(250, Ordering::Relaxed);
        measures.polite.cooldowns.fetch_add(1, Ordering::Relaxed);
        measures
            .polite
            .robots_fetches
            .fetch_add(1, Ordering::Relaxed);
        measures
            .polite
            .robots_disallowed
            .fetch_add(1, Ordering::Relaxed);

        let mut spend = Spend::default();
        let spent = TierSpend {
            requests: 2,
            bytes: 300,
            wire_bytes: 120,
            blocks: 1,
        };
        spend.add(2, spent);
        spend.add_direct_blocks(1);
        measures.spent(&spend);
        measures.spent(&spend);
        measures.not_modified(2048);

        let mut tally = Tally::of(&outcomes, measures);
        tally.own = vec![("Renders", "Count", 3)];

        let expected = Tally {
            records: 13,
            succeeded: 2,
            duplicate_guarded: 2,
            poison: 1,
            not_wanted: 1,
            failed: 2,
            retried: 2,
            fetch_ms: vec![120.0],
            bytes_stored: 36,
            shells_stored: 1,
            not_modified: 1,
            bytes_not_fetched: 2048,
            conflicts: 3,
            polite_holds: 2,
            polite_slept_ms: 250,
            host_cooldowns: 1,
            robots_fetches: 1,
            robots_disallowed: 1,
            robots_paid_bytes: 0,
            spend: spend.plus(&spend),
            trace_spans_dropped: 0,
            handed_over: 1,
            own: vec![("Renders", "Count", 3)],
        };
        assert_eq!(tally, expected);
        let document = &tally.documents(&settings(), "r", SystemTime::UNIX_EPOCH)[0];
        assert_eq!(document["ProxyBytesTier2"], 600);
        assert_eq!(document["ProxyRequestsTier2"], 4);
        assert_eq!(document["ProxyWireBytesTier2"], 240);
        assert!(document.get("ProxyBytesTier1").is_none());
        assert_eq!(
            document["Blocked"], 4,
            "a block on tier 2 and one direct, twice"
        );
        assert_eq!(document["NotModified"], 1);
        assert_eq!(document["HandedOver"], 1);
        assert_eq!(document["Renders"], 3, "the processor's own measures");
        assert_eq!(document["BytesNotFetched"], 2048);
        assert_eq!(document["ShellsStored"], 1);
    }

    #[test]
    fn one_invocation_is_one_valid_emf_document() {
        let tally = Tally {
            records: 3,
            succeeded: 1,
            retried: 2,
            fetch_ms: vec![12.5, 80.0],
            bytes_stored: 4096,
            ..Tally::default()
        };
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);

        let documents = tally.documents(&settings(), "req-1", at);

        assert_eq!(documents.len(), 1);
        let doc = &documents[0];
        assert_eq!(emf_problems(doc), Vec::<String>::new());
        assert_eq!(doc["_aws"]["Timestamp"], 1_700_000_000_123_u64);
        assert_eq!(doc["_aws"]["CloudWatchMetrics"][0]["Namespace"], "conveyor");
        assert_eq!(doc["Service"], "conveyor-worker");
        assert_eq!(doc["requestId"], "req-1");
        assert_eq!(doc["Records"], 3);
        assert_eq!(doc["Retried"], 2);
        assert_eq!(doc["FetchLatency"], json!([12.5, 80.0]));
        assert_eq!(doc["BytesStored"], 4096);
    }

    #[test]
    fn a_batch_without_fetches_has_no_latency_metric() {
        let tally = Tally {
            records: 1,
            duplicate_guarded: 1,
            ..Tally::default()
        };

        let documents = tally.documents(&settings(), "req-1", SystemTime::now());

        assert_eq!(emf_problems(&documents[0]), Vec::<String>::new());
        assert!(documents[0].get("FetchLatency").is_none());
    }

    #[test]
    fn latencies_beyond_the_emf_cap_follow_in_further_documents() {
        let tally = Tally {
            records: 250,
            fetch_ms: (0..250).map(f64::from).collect(),
            ..Tally::default()
        };

        let documents = tally.documents(&settings(), "req-1", SystemTime::now());

        assert_eq!(documents.len(), 3);
        for doc in &documents {
            assert_eq!(emf_problems(doc), Vec::<String>::new());
        }
        let sizes: Vec<usize> = documents
            .iter()
            .map(|d| d["FetchLatency"].as_array().map_or(0, Vec::len))
            .collect();
        assert_eq!(sizes, [100, 100, 50]);
        assert_eq!(
            documents[1].get("Records"),
            None,
            "counts are in the first only"
        );
    }

    #[test]
    fn the_checker_rejects_what_the_specification_forbids() {
        let bad = json!({
            "_aws": {
                "Timestamp": "now",
                "CloudWatchMetrics": [{
                    "Namespace": "",
                    "Dimensions": [["Service"]],
                    "Metrics": [{"Name": "Records", "Unit": "Things"}, {"Name": "Gone"}],
                }],
            },
            "Records": "three",
        });

        assert_eq!(emf_problems(&bad).len(), 7, "{:?}", emf_problems(&bad));
    }

    #[test]
    fn emit_writes_one_line_per_document() {
        let docs = Tally::default().documents(&settings(), "r", SystemTime::now());
        let mut out = Vec::new();

        emit(&mut out, &docs).expect("write to a Vec");

        let text = String::from_utf8(out).expect("JSON is UTF-8");
        assert_eq!(text.lines().count(), 1);
        let parsed: Value = serde_json::from_str(text.trim_end()).expect("one JSON line");
        assert_eq!(parsed, docs[0]);
    }
}
