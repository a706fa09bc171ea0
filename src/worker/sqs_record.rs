//! What an SQS record says of itself: how many times its message was received, when it was
//! sent, whether it came from a FIFO queue; and its task named in the record's span. The
//! stages that read a record (`parse`, `park`) share these.

use aws_lambda_events::event::sqs::SqsMessage;

use crate::domain::ids::TaskRef;

/// Names the task in the record's span, so each of its log lines says which task it is of.
pub(super) fn name_span(task: &TaskRef) {
    let span = tracing::Span::current();
    span.record("job_id", task.job_id.as_str());
    span.record("run_id", task.run_id.as_str());
    span.record("task_id", task.task_id.as_str());
}

/// Whether the record came from a FIFO queue (its ARN ends in `.fifo`).
pub(super) fn on_fifo(record: &SqsMessage) -> bool {
    record
        .event_source_arn
        .as_deref()
        .is_some_and(|arn| arn.ends_with(".fifo"))
}

/// SQS's `SentTimestamp` (ms since the epoch), if the record has it.
pub(super) fn sent_at(record: &SqsMessage) -> Option<u64> {
    record.attributes.get("SentTimestamp")?.parse().ok()
}

/// SQS's `ApproximateReceiveCount`: 1 on the first delivery. Missing or odd values count as 1.
pub(super) fn receive_count(record: &SqsMessage) -> u32 {
    record
        .attributes
        .get("ApproximateReceiveCount")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}
