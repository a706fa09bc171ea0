//! The operator's tool: the producer's half (submit a list of URLs, read a run's results),
//! the runbook's routines (progress, re-queue failed tasks, replay the poison quarantine),
//! and the worker run against a queue the way Lambda's event source mapping would. One file
//! per command; the routines themselves are in the library's `ops`.

mod poll;
mod progress;
mod replay;
mod report;
mod requeue;
mod results;
mod submit;

use std::error::Error;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use conveyor_worker::aws;
use conveyor_worker::domain::ids::Id;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::s3::S3ResultStore;
use conveyor_worker::store::sqs::SqsQueue;
use lambda_runtime::tracing::subscriber::{EnvFilter, fmt};

#[derive(Parser)]
#[command(
    version,
    about = "Operate conveyor-worker: submit runs, watch them, read results, re-queue, replay"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Submit(submit::SubmitArgs),
    Progress(progress::ProgressArgs),
    Results(results::ResultsArgs),
    RequeueFailed(requeue::RequeueArgs),
    ReplayQuarantine(replay::ReplayArgs),
    Poll(poll::PollArgs),
}

/// A run of the table.
#[derive(Args)]
struct RunArgs {
    /// The table (the stack's TableName output).
    #[arg(long, env = "TABLE_NAME")]
    table: String,
    #[arg(long, value_parser = parse_id)]
    job: Id,
    #[arg(long, value_parser = parse_id)]
    run: Id,
}

fn parse_id(raw: &str) -> Result<Id, String> {
    Id::parse(raw).map_err(|e| e.to_string())
}

type Outcome = Result<(), Box<dyn Error>>;

#[tokio::main]
async fn main() -> ExitCode {
    fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Submit(args) => submit::run(args).await,
        Command::Progress(args) => progress::run(args).await,
        Command::Results(args) => results::run(args).await,
        Command::RequeueFailed(args) => requeue::run(args).await,
        Command::ReplayQuarantine(args) => replay::run(args).await,
        Command::Poll(args) => poll::run(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("conveyor-ops: {}", explain(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// An error with every cause under it ("GetItem(run) not sent: dispatch failure: ...:
/// Connection refused"), each said once.
fn explain(err: &(dyn Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        let said = next.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = next.source();
    }
    text
}

/// The standard AWS settings, with the system's certificate store.
async fn sdk() -> aws_config::SdkConfig {
    aws::sdk_config(aws::Trust::System).await
}

fn tasks(sdk: &aws_config::SdkConfig, table: String) -> DynamoTaskStore {
    DynamoTaskStore::new(aws_sdk_dynamodb::Client::new(sdk), table)
}

fn queue(sdk: &aws_config::SdkConfig, url: &str) -> SqsQueue {
    SqsQueue::new(aws_sdk_sqs::Client::new(sdk), url)
}

fn objects(sdk: &aws_config::SdkConfig, bucket: String) -> S3ResultStore {
    S3ResultStore::new(
        aws_sdk_s3::Client::from_conf(aws::s3_config(sdk).build()),
        bucket,
    )
}
