//! `conveyor-ops progress`: a run's status, counters and tasks by status, once or until it
//! ends; a run that stops moving is named as stalled, with what to run.

use std::time::{Duration, Instant};

use clap::Args;
use conveyor_ops::progress::{self, RunProgress};
use conveyor_worker::store::dynamo::DynamoTaskStore;

use crate::exit::{Exit, stop};
use crate::{Outcome, RunArgs, count, queue, sdk, tasks};

/// Show a run's status, counters and tasks by status, and its failed tasks with why.
#[derive(Args)]
pub struct ProgressArgs {
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// How many failed tasks to list.
    #[arg(long, default_value_t = 20)]
    failures: usize,
    /// Refresh until the run ends (exit code 0 once completed, 1 cancelled or failed) or
    /// stalls (exit code 3).
    #[arg(long)]
    watch: bool,
    /// How often to refresh with --watch.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    every: Duration,
    /// With --watch: a run whose tasks have not moved for this long, with nothing left in
    /// the queue (visible, in flight or delayed), is stalled; without --queue-url it is
    /// said, not called stalled.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    stall_after: Duration,
    /// The task queue, to tell a stalled run from tasks waiting in it (with --watch).
    #[arg(long, env = "QUEUE_URL")]
    pub(crate) queue_url: Option<String>,
    /// The run as one JSON object (progress lines go to stderr).
    #[arg(long)]
    json: bool,
}

pub async fn run(args: ProgressArgs) -> Outcome {
    let sdk = sdk().await;
    let tasks = tasks(&sdk, args.run.table.clone());
    let (job, run) = (&args.run.job, &args.run.run);
    let progress = progress::progress(&tasks, job, run).await?;
    let (progress, watch) = match args.watch {
        true => watched(&args, &tasks, &sdk, progress).await?,
        false => (progress, Watched::default()),
    };
    if args.json {
        say!("{}", json(&progress, &watch)?);
    } else {
        print(&args, &progress);
    }
    match (
        &watch.stalled,
        progress.run.get("status").map(String::as_str),
    ) {
        (Some(stalled), _) => Err(stop(Exit::Incomplete, stalled.clone())),
        (None, Some(status @ ("cancelled" | "failed"))) if args.watch => Err(stop(
            Exit::Failed,
            format!("run {job}/{run} ended {status}"),
        )),
        _ => Ok(()),
    }
}

/// What watching found: the rate, and a stall if the run stopped moving.
#[derive(Debug, Default)]
struct Watched {
    rate: f64,
    stalled: Option<String>,
}

/// The run as one JSON object, with what watching found.
fn json(progress: &RunProgress, watch: &Watched) -> Result<String, serde_json::Error> {
    let mut value = serde_json::to_value(progress)?;
    let left = progress.total() - progress.finished();
    let eta = (left > 0 && watch.rate > 0.0).then(|| left as f64 / watch.rate);
    if let Some(object) = value.as_object_mut() {
        object.insert("ended".into(), progress.ended().into());
        object.insert("disagreement".into(), progress.disagreement().into());
        object.insert("tasks_per_second".into(), watch.rate.into());
        object.insert("eta_seconds".into(), eta.into());
        object.insert("stalled".into(), watch.stalled.clone().into());
    }
    serde_json::to_string(&value)
}

/// Refreshes until the run ends or stalls: a stall is no task moving for `--stall-after`
/// while the queue holds nothing (visible, in flight or delayed). Without the queue, or when
/// it cannot be read, a run whose tasks wait in it (held for politeness, backing off) cannot
/// be told from a stalled one: that is said once, and the watch goes on.
async fn watched(
    args: &ProgressArgs,
    tasks: &DynamoTaskStore,
    sdk: &aws_config::SdkConfig,
    mut progress: RunProgress,
) -> Result<(RunProgress, Watched), Box<dyn std::error::Error>> {
    let (job, run) = (&args.run.job, &args.run.run);
    let queue = args.queue_url.as_deref().map(|url| queue(sdk, url));
    let (started, first) = (Instant::now(), progress.finished());
    let mut moved = (Instant::now(), progress.by_status.clone());
    let mut unsure_said = false;
    let mut watch = Watched::default();
    while !progress.ended() {
        let elapsed = started.elapsed().as_secs_f64().max(1e-3);
        watch.rate = (progress.finished() - first) as f64 / elapsed;
        line(args, &progress, watch.rate);
        if moved.1 != progress.by_status {
            moved = (Instant::now(), progress.by_status.clone());
        }
        if moved.0.elapsed() >= args.stall_after {
            let queued = match &queue {
                Some(queue) => queue.depth().await.ok(),
                None => None,
            };
            match queued {
                Some(0) => {
                    watch.stalled = Some(stalled(args, &progress));
                    return Ok((progress, watch));
                }
                None if !unsure_said => {
                    unsure_said = true;
                    eprintln!("{}", unsure(args));
                }
                _ => {}
            }
        }
        tokio::time::sleep(args.every).await;
        progress = progress::progress(tasks, job, run).await?;
    }
    line(args, &progress, 0.0);
    Ok((progress, watch))
}

/// Why a run that stopped moving is not called stalled.
fn unsure(args: &ProgressArgs) -> String {
    let still = humantime::format_duration(args.stall_after);
    let why = match &args.queue_url {
        None => "without --queue-url (QUEUE_URL) the queue is not looked at",
        Some(_) => "the queue could not be read",
    };
    format!(
        "note: no task moved for {still}; {why}, so a stall cannot be told from tasks \
         waiting in it: watching on"
    )
}

/// One progress line: ended of total, the rate, and the time left (unknown at no rate).
fn line(args: &ProgressArgs, progress: &RunProgress, rate: f64) {
    let (done, total) = (progress.finished(), progress.total());
    let left = match total - done {
        0 => "none left".to_owned(),
        _ if rate <= 0.0 => "time left unknown".to_owned(),
        n => format!(
            "about {} left",
            humantime::format_duration(secs(n as f64 / rate))
        ),
    };
    let text = format!(
        "{done}/{} ended, {rate:.1} a second, {left}",
        count(total, "task")
    );
    if args.json {
        eprintln!("{text}");
    } else {
        say!("{text}");
    }
}

fn secs(seconds: f64) -> Duration {
    Duration::from_secs(seconds.clamp(0.0, 1e9).round() as u64)
}

/// What a stall is: which tasks are stuck, and what to run.
fn stalled(args: &ProgressArgs, progress: &RunProgress) -> String {
    let (job, run) = (&args.run.job, &args.run.run);
    let still = humantime::format_duration(args.stall_after);
    let mut text = format!(
        "run {job}/{run} stalled: no task moved for {still}, and nothing is queued, in \
         flight or delayed"
    );
    if !progress.open.is_empty() {
        let open: Vec<String> = progress
            .open
            .iter()
            .map(|(t, s)| format!("{t} ({s})"))
            .collect();
        text.push_str(&format!("; not ended: {}", open.join(", ")));
        text.push_str(&format!(
            "; their messages are gone: conveyor-ops requeue-failed --job {job} --run {run} \
             --resend-open sends them again"
        ));
    } else if let Some(why) = progress.disagreement() {
        text.push_str(&format!("; {why}"));
    }
    text
}

fn print(args: &ProgressArgs, progress: &RunProgress) {
    say!("run {}/{}", args.run.job, args.run.run);
    for (field, value) in &progress.run {
        say!("  {field:<16} {value}");
    }
    say!("tasks ({}):", progress.total());
    for (status, count) in &progress.by_status {
        say!("  {status:<16} {count}");
    }
    if let Some(why) = progress.disagreement() {
        say!("note: {why}");
    }
    if !progress.failures.is_empty() {
        say!("failed tasks:");
        for (task, error) in progress.failures.iter().take(args.failures) {
            say!("  {task:<32} {error}");
        }
        let more = progress.failures.len().saturating_sub(args.failures);
        if more > 0 {
            say!("  ... and {more} more (--failures N lists more)");
        }
    }
}
