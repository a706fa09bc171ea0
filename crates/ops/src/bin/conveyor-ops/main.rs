//! The operator's tool: the producer's half (submit a list of URLs, read a run's results),
//! the runbook's routines (progress, re-queue failed tasks, replay the poison quarantine),
//! a host's politeness state shown or reset, and the worker run against a queue the way
//! Lambda's event source mapping would. One file per command; the routines themselves are
//! in this crate's library (`crates/ops/src`).

/// `println!` for what a command reports: a reader that went away (`| head -1`) ends the
/// process quietly, with the status a shell gives a writer killed by SIGPIPE (141), instead
/// of `println!`'s panic.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::said(std::format_args!($($arg)*))
    };
}

mod exit;
mod host;
mod poll;
mod progress;
mod redrive;
mod replay;
mod report;
mod requeue;
mod results;
mod submit;

use std::error::Error;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use conveyor_ops::count;
use conveyor_worker::Config;
use conveyor_worker::domain::ids::Id;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::s3::S3ResultStore;
use conveyor_worker::store::sqs::SqsQueue;
use conveyor_worker::wiring::aws;
use conveyor_worker::wiring::traces;
use exit::{Exit, Named};
use lambda_runtime::tracing::subscriber::prelude::*;
use lambda_runtime::tracing::subscriber::{EnvFilter, fmt};

#[derive(Parser)]
#[command(
    name = "conveyor-ops",
    version,
    after_help = "Exit codes: 0 done, 1 failed, 2 bad input, 3 incomplete, 4 dead-lettered, \
                  5 AWS out of reach or refusing (docs/runbook.md)",
    about = "Operate conveyor-worker: submit runs, watch them, read results, re-queue, replay, \
             show or reset a host"
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
    Redrive(redrive::RedriveArgs),
    Poll(poll::PollArgs),
    Host(host::HostArgs),
}

impl Command {
    /// The table, bucket and queue this command names, for its errors.
    fn named(&self) -> Named {
        let env = |name: &str| std::env::var(name).ok();
        let (table, bucket, queue) = match self {
            Self::Submit(a) => (Some(&a.table), None, Some(&a.queue_url)),
            Self::Progress(a) => (Some(&a.run.table), None, a.queue_url.as_ref()),
            Self::Results(a) => (Some(&a.run.table), Some(&a.bucket), None),
            Self::RequeueFailed(a) => (Some(&a.run.table), None, Some(&a.queue_url)),
            Self::ReplayQuarantine(a) => (None, Some(&a.bucket), Some(&a.queue_url)),
            Self::Redrive(a) => (None, None, Some(&a.queue_url)),
            Self::Poll(a) => (None, None, Some(&a.queue_url)),
            Self::Host(a) => (Some(a.action.table()), None, None),
        };
        Named {
            table: table.cloned().or_else(|| env("TABLE_NAME")),
            bucket: bucket.cloned().or_else(|| env("RESULTS_BUCKET")),
            queue_url: queue.cloned().or_else(|| env("QUEUE_URL")),
            region_missing: false,
        }
    }
}

/// A run of the table.
#[derive(Args)]
struct RunArgs {
    /// The table (the stack's TableName output).
    #[arg(long, env = "TABLE_NAME")]
    table: String,
    /// The job's id (letters, digits, `-` and `_`).
    #[arg(long, value_parser = parse_id)]
    job: Id,
    /// The run's id within the job.
    #[arg(long, value_parser = parse_id)]
    run: Id,
}

fn parse_id(raw: &str) -> Result<Id, String> {
    Id::parse(raw).map_err(|e| e.to_string())
}

type Outcome = Result<(), Box<dyn Error>>;

/// The status a shell gives a writer killed by SIGPIPE: what a closed pipe exits with.
const CLOSED_PIPE: i32 = 141;

/// One line to stdout ([`say!`]).
fn said(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(err) = writeln!(std::io::stdout().lock(), "{line}") {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(CLOSED_PIPE);
        }
        eprintln!("conveyor-ops: cannot write to stdout: {err}");
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    // The SDK's credential chain warns at every provider it tries (instance metadata, ...):
    // a missing credential is said once, by the error it ends in.
    let quiet_sdk = "warn,aws_config=error,aws_smithy_runtime=error";
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| quiet_sdk.into());
    let filter = traces::without_steps(filter);
    let logs = fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage(&err),
    };
    // `poll` runs the worker, so it traces as the function does.
    let tracing = match &cli.command {
        Command::Poll(_) => Config::from_env().ok().map(|config| config.tracing),
        _ => None,
    };
    let traces = traces::init_with(logs.boxed(), tracing.as_ref(), "conveyor-ops-poll");
    let named = cli.command.named();
    let result = match cli.command {
        Command::Submit(args) => submit::run(args).await,
        Command::Progress(args) => progress::run(args).await,
        Command::Results(args) => results::run(args).await,
        Command::RequeueFailed(args) => requeue::run(args).await,
        Command::ReplayQuarantine(args) => replay::run(args).await,
        Command::Redrive(args) => redrive::run(args).await,
        Command::Poll(args) => poll::run(args).await,
        Command::Host(args) => host::run(args).await,
    };
    if let Some(traces) = traces {
        traces.shutdown();
    }
    match result {
        Ok(()) => Exit::Done.into(),
        Err(err) => {
            let named = Named {
                region_missing: sdk().await.region().is_none(),
                ..named
            };
            let (exit, line) = exit::ending(err.as_ref(), &named);
            eprintln!("conveyor-ops: {line}");
            exit.into()
        }
    }
}

/// A command line clap refused: its message, with the environment variable that can give a
/// missing value; help and the version are no error.
fn usage(err: &clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let _ = err.print();
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        return Exit::Done.into();
    }
    if err.kind() == ErrorKind::MissingRequiredArgument
        && let Some(ContextValue::Strings(missing)) = err.get(ContextKind::InvalidArg)
    {
        // Each missing argument as its usage says it: "--table <TABLE>".
        let flags: Vec<&str> = missing
            .iter()
            .filter_map(|arg| arg.split(' ').next())
            .collect();
        for (flag, env) in ENV_OF {
            if flags.contains(&flag) {
                eprintln!("  {flag} can come from the environment: set {env}");
            }
        }
    }
    Exit::BadInput.into()
}

/// The flags an environment variable can give.
const ENV_OF: [(&str, &str); 4] = [
    ("--table", "TABLE_NAME"),
    ("--bucket", "RESULTS_BUCKET"),
    ("--queue-url", "QUEUE_URL"),
    ("--prefix", "QUARANTINE_PREFIX"),
];

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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::collections::BTreeSet;

    const RUNBOOK: &str = include_str!("../../../../../docs/runbook.md");

    /// The rows of the runbook's table that follows `heading` (a bold line): each row's
    /// first cell.
    fn first_cells(heading: &str) -> Vec<String> {
        let after = RUNBOOK.split(heading).nth(1).expect("the heading");
        after
            .lines()
            .skip_while(|line| !line.starts_with('|'))
            .take_while(|line| line.starts_with('|'))
            .skip(2)
            .filter_map(|line| line.split('|').nth(1).map(|c| c.trim().to_owned()))
            .collect()
    }

    /// The tool's commands.
    fn commands() -> BTreeSet<String> {
        let cli = Cli::command();
        cli.get_subcommands()
            .map(|c| c.get_name().to_owned())
            .collect()
    }

    /// Every long flag of every command (a command's own commands too), and their aliases.
    fn flags() -> BTreeSet<String> {
        let cli = Cli::command();
        let commands = cli
            .get_subcommands()
            .flat_map(|c| c.get_subcommands().chain([c]));
        let args = commands.flat_map(|c| c.get_arguments());
        args.flat_map(|arg| {
            let aliases = arg.get_all_aliases().unwrap_or_default();
            arg.get_long().into_iter().chain(aliases).map(str::to_owned)
        })
        .collect()
    }

    #[test]
    fn the_runbooks_commands_are_the_tools_and_every_command_is_in_the_runbook() {
        let commands = commands();
        let listed: BTreeSet<String> = first_cells("**Commands**")
            .iter()
            .filter_map(|cell| cell.trim_matches('`').split(' ').next().map(str::to_owned))
            .collect();

        assert_eq!(listed, commands, "the runbook's commands, and the tool's");
    }

    /// The flags the runbook names for the tool: in code that starts with `conveyor-ops`
    /// or a command's name, or that is a flag alone (not the AWS CLI's or cargo's).
    fn flags_named(commands: &BTreeSet<String>) -> BTreeSet<String> {
        let ours = |line: &str| {
            let first = line.split_whitespace().next().unwrap_or_default();
            first == "conveyor-ops" || first.starts_with("--") || commands.contains(first)
        };
        // Fenced blocks hold a command a line (continued with `\`); in the prose, a code
        // span may wrap across lines.
        let mut code: Vec<String> = Vec::new();
        for (i, part) in RUNBOOK.split("```").enumerate() {
            if i % 2 == 1 {
                code.push(part.replace("\\\n", " "));
            } else {
                let spans = part.split('`').skip(1).step_by(2);
                code.extend(spans.map(|span| span.replace('\n', " ")));
            }
        }
        code.iter()
            .flat_map(|code| code.lines())
            .filter(|line| ours(line.trim()))
            .flat_map(str::split_whitespace)
            .filter_map(|word| word.strip_prefix("--"))
            .map(|flag| flag.split('=').next().unwrap_or(flag).to_owned())
            .filter(|flag| !flag.is_empty())
            .collect()
    }

    #[test]
    fn every_flag_the_runbook_names_is_a_flag_of_the_tool() {
        let (commands, flags) = (commands(), flags());

        let named = flags_named(&commands);

        let unknown: Vec<_> = named
            .iter()
            .filter(|flag| !flags.contains(*flag) && !["help", "version"].contains(&flag.as_str()))
            .collect();
        assert!(named.len() >= 10, "{named:?}");
        assert!(
            unknown.is_empty(),
            "the runbook names {unknown:?}, which no command takes"
        );
    }

    #[test]
    fn the_runbooks_exit_codes_are_the_tools() {
        let exits = [
            Exit::Done,
            Exit::Failed,
            Exit::BadInput,
            Exit::Incomplete,
            Exit::DeadLettered,
            Exit::Aws,
        ];
        let mut codes: Vec<String> = exits.iter().map(|e| (*e as u8).to_string()).collect();
        // A reader that went away (`| head -1`).
        codes.push(CLOSED_PIPE.to_string());

        assert_eq!(first_cells("**Exit codes**"), codes);
    }
}
