//! What an operator sees of a real batch against the emulator: JSON log lines (as Lambda's
//! advanced logging sets `AWS_LAMBDA_LOG_FORMAT=JSON`) with the request id, message id,
//! job / run / task ids, outcome and duration of every record, no page content; and the
//! invocation's metrics in Embedded Metric Format.

use std::time::{Duration, SystemTime};

use conveyor_testkit::logs::Captured;
use conveyor_testkit::*;
use conveyor_worker::batch::run_batch;
use conveyor_worker::metrics::MetricsSettings;
use serde_json::Value;

/// The JSON lines written so far.
fn lines(logs: &Captured) -> Vec<Value> {
    let text = logs.text();
    let each = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")));
    each.collect()
}

/// The line that ends the record with this message id.
fn record_line<'a>(lines: &'a [Value], message_id: &str) -> &'a Value {
    let mut found = lines
        .iter()
        .filter(|l| l["span"]["name"] == "record" && l["span"]["message_id"] == message_id)
        .filter(|l| l["fields"]["outcome"].is_string() && l["fields"]["duration_ms"].is_u64());
    let line = found.next().expect("a closing line for the record");
    assert!(found.next().is_none(), "one closing line per record");
    line
}

#[tokio::test]
async fn every_record_logs_ids_outcome_and_duration_as_json_and_the_batch_its_metrics() {
    // Arrange: JSON lines as lambda_runtime's subscriber writes them under
    // AWS_LAMBDA_LOG_FORMAT=JSON (its `init_default_subscriber`: fmt, no target, JSON), for
    // this test's thread only (the other tests of this binary log their own way).
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_target(false)
        .json()
        .with_writer(move || writer.clone())
        .finish();
    let _scope = tracing::subscriber::set_default(subscriber);
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("fine", &site.url("/page/a"), "pending")
        .await;
    stack
        .put_task("busy", &site.url("/status/503"), "pending")
        .await;
    let records = vec![
        delivery("fine"),
        record("poison", "not json", 1),
        delivery("busy"),
    ];
    let request_id = unique("request");

    // Act
    let deadline = SystemTime::now() + Duration::from_secs(60);
    let run = run_batch(&stack.worker(), &records, &request_id, deadline, LIMITS).await;

    // Assert: one JSON line closes each record, inside the batch's span.
    let lines = lines(&logs);
    let fine = record_line(&lines, "fine");
    assert_eq!(fine["fields"]["outcome"], "succeeded");
    assert_eq!(fine["span"]["job_id"], JOB);
    assert_eq!(fine["span"]["run_id"], RUN);
    assert_eq!(fine["span"]["task_id"], "fine");
    assert_eq!(record_line(&lines, "poison")["fields"]["outcome"], "poison");
    assert_eq!(
        record_line(&lines, "busy")["fields"]["outcome"],
        "scrape_transient"
    );
    for id in ["fine", "poison", "busy"] {
        let spans = &record_line(&lines, id)["spans"];
        let batch = spans
            .as_array()
            .and_then(|s| s.first())
            .expect("a span list");
        assert_eq!(batch["name"], "batch");
        assert_eq!(batch["request_id"], request_id.as_str());
    }
    let text = lines.iter().map(Value::to_string).collect::<String>();
    assert!(!text.contains("page a"), "no page content in the logs");

    // Assert: the metrics count what happened.
    let settings = MetricsSettings {
        namespace: "conveyor".into(),
        service: "conveyor-worker".into(),
    };
    let documents = run
        .tally
        .documents(&settings, &request_id, SystemTime::now());
    assert_eq!(documents.len(), 1);
    let doc = &documents[0];
    for (metric, value) in [
        ("Records", 3),
        ("Succeeded", 1),
        ("Poison", 1),
        ("Retried", 1),
        ("DuplicateGuarded", 0),
        ("NotWanted", 0),
        ("FailedPermanently", 0),
    ] {
        assert_eq!(doc[metric], value, "{metric}");
    }
    let page = b"<html><body>page a</body></html>".len();
    assert_eq!(doc["BytesStored"], page as u64);
    let latencies = doc["FetchLatency"].as_array().expect("two fetches timed");
    assert_eq!(latencies.len(), 2);
    assert!(
        latencies
            .iter()
            .all(|ms| ms.as_f64().is_some_and(|ms| ms > 0.0))
    );
    assert_eq!(doc["requestId"], request_id.as_str());
    assert_eq!(
        doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0][0],
        "Service"
    );
}
