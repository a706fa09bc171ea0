//! The front door: the Lambda handler. One SQS batch in, the partial batch response out,
//! and the invocation's metrics (EMF) on stdout. `main.rs` builds the worker once per cold
//! start and calls this for every invocation; the batch (`batch/`) runs each record through
//! the worker's pipeline (`Worker::process`).

use std::time::SystemTime;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::LambdaEvent;

use crate::batch::{self, BatchLimits, ProcessRecord};
use crate::metrics::{self, MetricsSettings};
use crate::trace;

/// One invocation: its batch run within its deadline, its metrics written, its reply.
pub async fn handle<P: ProcessRecord>(
    processor: &P,
    limits: BatchLimits,
    metrics: &MetricsSettings,
    event: LambdaEvent<SqsEvent>,
) -> SqsBatchResponse {
    let deadline = event.context.deadline();
    let request_id = &event.context.request_id;
    let records = &event.payload.records;
    let mut run = batch::run_batch(processor, records, request_id, deadline, limits).await;
    run.tally.trace_spans_dropped = trace::take_dropped();
    let documents = run.tally.documents(metrics, request_id, SystemTime::now());
    if let Err(err) = metrics::emit(&mut std::io::stdout().lock(), &documents) {
        tracing::warn!(error = %err, "could not write the invocation's metrics");
    }
    run.response
}
