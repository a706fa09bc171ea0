//! `conveyor-ops host show|reset`: a host's politeness state as the fleet shares it, and its
//! reset so its work flows at once.

use clap::{Args, Subcommand};
use conveyor_ops::hosts;
use conveyor_worker::domain::limits::{Host, Millis};

use crate::{Outcome, sdk, tasks};

/// Show a host's schedule, slowdown, cooldown, in-flight slots and robots.txt, or reset
/// them. The host is a URL (keyed as the worker keys it) or a key as stored:
/// `example.com:443`, `domain:example.com`, `address:192.0.2.1`.
#[derive(Args)]
pub struct HostArgs {
    #[command(subcommand)]
    pub(crate) action: HostAction,
}

#[derive(Subcommand)]
pub enum HostAction {
    Show(ShowArgs),
    Reset(ResetArgs),
}

impl HostAction {
    pub(crate) fn table(&self) -> &String {
        match self {
            Self::Show(a) => &a.host.table,
            Self::Reset(a) => &a.host.table,
        }
    }
}

/// A host in the table.
#[derive(Args)]
pub struct HostRef {
    /// The table (the stack's TableName output).
    #[arg(long, env = "TABLE_NAME")]
    pub(crate) table: String,
    /// A URL of the host, or its key as stored (`example.com:443`, `domain:example.com`,
    /// `address:192.0.2.1`).
    #[arg(value_name = "HOST_OR_URL", value_parser = parse_host)]
    host: Host,
    /// One JSON object, for scripts.
    #[arg(long)]
    json: bool,
}

/// Show the host's state as the fleet shares it, times relative to now: how far ahead its
/// schedule is booked and by which run, its slowdown and cooldown, the in-flight slots
/// held, its answer times, and its robots.txt.
#[derive(Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub(crate) host: HostRef,
}

/// Clear the host's schedule (next start, tail, slowdown, knee, cooldown, in-flight slots)
/// so its next fetch starts at once. Safe while the fleet works: see docs/runbook.md.
#[derive(Args)]
pub struct ResetArgs {
    #[command(flatten)]
    pub(crate) host: HostRef,
    /// Delete the host's robots.txt item too, so it is fetched again.
    #[arg(long)]
    robots: bool,
}

fn parse_host(raw: &str) -> Result<Host, String> {
    Host::parse_key(raw).map_err(str::to_owned)
}

pub async fn run(args: HostArgs) -> Outcome {
    let sdk = sdk().await;
    match args.action {
        HostAction::Show(ShowArgs { host }) => {
            let store = tasks(&sdk, host.table);
            let report = hosts::show(&store, &host.host, now_ms()).await?;
            match host.json {
                true => say!("{}", report.json()),
                false => report.lines().iter().for_each(|line| say!("{line}")),
            }
        }
        HostAction::Reset(ResetArgs { host, robots }) => {
            let store = tasks(&sdk, host.table);
            let reset = hosts::reset(&store, &host.host, robots, now_ms()).await?;
            match host.json {
                true => say!("{}", reset.json()),
                false => reset.lines().iter().for_each(|line| say!("{line}")),
            }
        }
    }
    Ok(())
}

/// Milliseconds since the Unix epoch, the clock the host items keep.
fn now_ms() -> Millis {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as Millis)
}
