//! The demo data set behind `make run` and the sample-event test: the tasks that the events
//! in `events/` name, seeded so that each event shows one row of the ack contract.

use std::path::{Path, PathBuf};

use super::{Site, Stack};

pub const JOB: &str = "demo-job";
pub const RUN: &str = "demo-run";

/// A seeded task: where it lives, its page (a site path or a whole URL), its status, and the
/// contract row it shows.
pub struct Seed {
    pub job: &'static str,
    pub run: &'static str,
    pub task: &'static str,
    pub url: &'static str,
    pub status: &'static str,
    pub row: &'static str,
    /// The status the task ends in after every sample event ran once.
    pub ends: &'static str,
}

const fn task(
    task: &'static str,
    url: &'static str,
    status: &'static str,
    row: &'static str,
    ends: &'static str,
) -> Seed {
    Seed {
        job: JOB,
        run: RUN,
        task,
        url,
        status,
        row,
        ends,
    }
}

pub const TASKS: &[Seed] = &[
    task(
        "pending-page",
        "/page/hello",
        "pending",
        "pending: claimed, scraped, stored, finished",
        "successful",
    ),
    task(
        "processing-page",
        "/page/again",
        "processing",
        "redelivery: scraped again, converged",
        "successful",
    ),
    task(
        "already-successful",
        "/page/done",
        "successful",
        "terminal: one read, no work",
        "successful",
    ),
    task(
        "already-failed",
        "/page/broken",
        "failed",
        "terminal: one read, no work",
        "failed",
    ),
    task(
        "not-found",
        "/status/404",
        "pending",
        "HTTP 404: failed for good",
        "failed",
    ),
    task(
        "bad-scheme",
        "ftp://example.com/file",
        "pending",
        "not http(s): failed for good",
        "failed",
    ),
    task(
        "unavailable",
        "/status/503",
        "pending",
        "HTTP 503: no terminal write, retried",
        "processing",
    ),
    task(
        "final-attempt",
        "/status/503",
        "processing",
        "HTTP 503 on the last attempt: failed",
        "failed",
    ),
    task(
        "mixed-ok",
        "/page/mixed",
        "pending",
        "pending: claimed, scraped, stored, finished",
        "successful",
    ),
    task(
        "mixed-redelivery",
        "/page/mixed-again",
        "processing",
        "redelivery: scraped again, converged",
        "successful",
    ),
    task(
        "mixed-done",
        "/page/mixed-done",
        "successful",
        "terminal: one read, no work",
        "successful",
    ),
    task(
        "mixed-404",
        "/status/404",
        "pending",
        "HTTP 404: failed for good",
        "failed",
    ),
    task(
        "mixed-503",
        "/status/503",
        "pending",
        "HTTP 503: no terminal write, retried",
        "processing",
    ),
    task(
        "mixed-429-final",
        "/status/429",
        "processing",
        "HTTP 429 on the last attempt: failed",
        "failed",
    ),
    Seed {
        job: "cancelled-job",
        ..task(
            "cancelled-task",
            "/page/cancelled",
            "pending",
            "job cancelled: no writes",
            "pending",
        )
    },
    Seed {
        run: "completed-run",
        ..task(
            "late-task",
            "/page/late",
            "pending",
            "run completed: no writes",
            "pending",
        )
    },
];

/// The renderer's tasks, in a run of their own: the events in `events/renderer/` name them.
pub const RENDER_RUN: &str = "render-run";

pub const RENDERED: &[Seed] = &[
    rendered(
        "app-page",
        "/app/demo",
        "pending",
        "rendered: stored as its script wrote it",
        "successful",
    ),
    rendered(
        "app-mixed",
        "/app/mixed",
        "pending",
        "rendered: stored as its script wrote it",
        "successful",
    ),
    rendered(
        "app-404",
        "/status/404",
        "pending",
        "HTTP 404: failed for good",
        "failed",
    ),
    rendered(
        "app-done",
        "/app/done",
        "successful",
        "terminal: one read, no work",
        "successful",
    ),
];

/// A task of the renderer's run ([`RENDER_RUN`]).
const fn rendered(
    name: &'static str,
    url: &'static str,
    status: &'static str,
    row: &'static str,
    ends: &'static str,
) -> Seed {
    Seed {
        run: RENDER_RUN,
        ..task(name, url, status, row, ends)
    }
}

/// The seeds of `seeds` whose tasks did not end as their contract row says: each with the
/// status it has.
pub async fn ended_otherwise(stack: &Stack, seeds: &[Seed]) -> Vec<String> {
    let mut wrong = Vec::new();
    for seed in seeds {
        let task = stack.task_in(seed.job, seed.run, seed.task).await;
        let status = task.status().unwrap_or("missing");
        if status != seed.ends {
            wrong.push(format!(
                "{}: {status}, not {} ({})",
                seed.task, seed.ends, seed.row
            ));
        }
    }
    wrong
}

/// The only messages the contract redelivers in the sample events.
pub const RETRIED: &[&str] = &["msg-unavailable", "mix-transient"];

/// Seeds the jobs, runs and tasks the sample events name.
pub async fn seed(stack: &Stack, site: &Site) {
    stack.put_job(JOB, "active").await;
    let in_run = TASKS
        .iter()
        .filter(|t| (t.job, t.run) == (JOB, RUN))
        .count();
    stack.put_counted_run(JOB, RUN, in_run as u32).await;
    stack
        .put_counted_run(JOB, RENDER_RUN, RENDERED.len() as u32)
        .await;
    stack.put_run(JOB, "completed-run", "completed").await;
    stack.put_job("cancelled-job", "cancelled").await;
    stack.put_run("cancelled-job", RUN, "running").await;
    for Seed {
        job,
        run,
        task,
        url,
        status,
        ..
    } in TASKS.iter().chain(RENDERED)
    {
        let url = if url.starts_with('/') {
            site.url(url)
        } else {
            url.to_string()
        };
        stack.put_task_in(job, run, task, &url, status).await;
    }
}

/// The data back as [`seed`] makes it: every item and object of the stack gone, then seeded.
pub async fn reset(stack: &Stack, site: &Site) {
    stack.clear().await;
    seed(stack, site).await;
}

/// The worker's sample events, in order.
pub fn event_files() -> std::io::Result<Vec<PathBuf>> {
    events_in("events")
}

/// The renderer's sample events, in order.
pub fn render_event_files() -> std::io::Result<Vec<PathBuf>> {
    events_in("events/renderer")
}

fn events_in(folder: &str) -> std::io::Result<Vec<PathBuf>> {
    // This crate is `testkit/` in the workspace.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent();
    let dir = workspace.unwrap_or(Path::new(".")).join(folder);
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|f| f.extension().is_some_and(|e| e == "json"));
    files.sort();
    Ok(files)
}
