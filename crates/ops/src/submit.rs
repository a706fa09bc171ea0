//! `conveyor-ops submit`: the producer's side. A list of URLs becomes a job, a run with its
//! counters (on the run item, or in counter shards), one pending task per URL (the data
//! contract), and one message per task.
//! It is safe to run again after a crash: creates never overwrite, and the run's submit
//! cursor says which tasks were written and sent.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt, stream};

use conveyor_worker::domain::ids::RunRef;
use conveyor_worker::domain::ids::{Id, TaskRef};
use conveyor_worker::domain::model::{Counting, ShardSizes, Sharding};
use conveyor_worker::domain::refresh::Prior;
use conveyor_worker::ports::error::StoreError;
use conveyor_worker::scraper::MAX_URL_BYTES;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::dynamo::attributes::{number, string};
use conveyor_worker::store::dynamo::runs::{Created, counting_of, spread_of};
use conveyor_worker::store::sqs::SqsQueue;

/// A line of the list that is not a URL the worker could fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// 1-based.
    pub line: usize,
    pub why: String,
}

/// The URLs to submit, each with its line number, which names its task ([`task_id`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UrlList {
    pub urls: Vec<(usize, String)>,
    pub invalid: Vec<Invalid>,
}

/// Reads a list: one URL per line. Blank lines and lines starting with `#` are skipped.
pub fn read_list(text: &str) -> UrlList {
    let mut list = UrlList::default();
    for (index, raw) in text.lines().enumerate() {
        let (line, raw) = (index + 1, raw.trim());
        if raw.is_empty() || raw.starts_with('#') {
            continue;
        }
        match check_url(raw) {
            Ok(url) => list.urls.push((line, url)),
            Err(why) => list.invalid.push(Invalid { line, why }),
        }
    }
    list
}

/// A URL the worker could fetch: it parses, is http or https, has no credentials, and is at
/// most 8 KB. Where it points is for the fetcher to judge, when it resolves the name.
pub fn check_url(raw: &str) -> Result<String, String> {
    if raw.len() > MAX_URL_BYTES {
        return Err(format!("longer than {MAX_URL_BYTES} bytes"));
    }
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("scheme {:?} is not http or https", url.scheme()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("has credentials".into());
    }
    Ok(url.to_string())
}

/// The task id of the URL on `line`, such as `t000042`. It stays the same while the list
/// does.
pub fn task_id(line: usize) -> Id {
    // Digits after a letter are always a valid id.
    Id::parse(&format!("t{line:06}")).expect("t and digits is an id")
}

/// What a submit did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// Tasks in the run.
    pub total: u64,
    /// Tasks already written and sent by an earlier submit, skipped.
    pub resumed_from: u64,
    /// Tasks this submit created. The rest of those it went through existed already.
    pub created: u64,
    /// Of those, tasks given their earlier result (a refresh run).
    pub with_earlier: u64,
    pub sent: u64,
}

/// Tasks written and sent between two moves of the run's submit cursor.
const CHUNK: usize = 100;
/// How many conditional puts are in flight at once.
const PUTS_AT_ONCE: usize = 16;

/// How a submitted run keeps its tasks: its counter tree (none: the run item counts, v1),
/// whether its tasks and results spread over the tree's shards (v3), and the earlier run of
/// the job it refreshes, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout<'a> {
    pub sharding: Option<Sharding>,
    pub spread: bool,
    pub refreshes: Option<&'a Id>,
}

/// An earlier run a refresh asks after: its id and how its tasks spread.
type EarlierRun<'a> = (&'a Id, Option<u32>);

/// Creates the job, the run and the tasks, and sends one message per task, a chunk at a
/// time. `progress` is told how many tasks are done after each chunk. A run that exists
/// keeps the layout it was created with.
pub async fn submit(
    tasks: &DynamoTaskStore,
    queue: &SqsQueue,
    run: RunRef<'_>,
    urls: &[(usize, String)],
    layout: Layout<'_>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Submitted, StoreError> {
    let (job, run_id) = (run.job_id, run.run_id);
    if let Created::Existing(item) = tasks.create_job(job).await?
        && string(&item, "status") == Some("cancelled")
    {
        return Err(refused(format!("job {job} is cancelled")));
    }
    let earlier = match layout.refreshes {
        Some(earlier) => Some(earlier_run(tasks, job, earlier).await?),
        None => None,
    };
    let (resumed_from, spread) = create_run(tasks, run, urls, layout).await?;
    let mut submitted = Submitted {
        total: urls.len() as u64,
        resumed_from,
        ..Submitted::default()
    };
    progress(resumed_from);
    let start = resumed_from as usize;
    for (index, chunk) in urls[start.min(urls.len())..].chunks(CHUNK).enumerate() {
        let run_of = (job, run_id, spread);
        let priors = match earlier {
            Some(earlier) => earlier_results(tasks, (job, earlier), chunk).await?,
            None => HashMap::new(),
        };
        let refs = create_tasks(tasks, run_of, (chunk, &priors), &mut submitted).await?;
        send_all(queue, &refs).await?;
        submitted.sent += refs.len() as u64;
        let through = (start + index * CHUNK + chunk.len()) as u64;
        tasks.advance_submitted(job, run_id, through).await?;
        progress(through);
    }
    Ok(submitted)
}

/// Creates the run with its counters, or takes the one an earlier submit created. Returns
/// where that one stopped, and how many shards the run's tasks spread over (v3), if they do.
async fn create_run(
    tasks: &DynamoTaskStore,
    run: RunRef<'_>,
    urls: &[(usize, String)],
    layout: Layout<'_>,
) -> Result<(u64, Option<u32>), StoreError> {
    let (job, run_id) = (run.job_id, run.run_id);
    let total = urls.len() as u64;
    let ids: Vec<Id> = urls.iter().map(|(line, _)| task_id(*line)).collect();
    let mut sizes = layout
        .sharding
        .map(|sharding| ShardSizes::of(sharding, &ids));
    let mut spread = sizes
        .as_ref()
        .filter(|_| layout.spread)
        .map(|s| s.sharding.shards);
    let how = (sizes.as_ref(), spread.is_some(), layout.refreshes);
    let created = tasks.create_run(run, total, how);
    let resumed_from = match created.await? {
        Created::Written => 0,
        Created::Existing(item) => {
            // A resumed run keeps the counters and the spread it was created with.
            sizes = match counting_of(&item) {
                Some(Counting::Shards(sharding)) => Some(ShardSizes::of(sharding, &ids)),
                _ => None,
            };
            spread = spread_of(&item);
            let from: u64 = number(&item, "submitted_through").unwrap_or(0);
            let submitted = &urls[..(from as usize).min(urls.len())];
            same_list(tasks, (job, run_id, spread), submitted).await?;
            same_length(&item, run, urls)?;
            from
        }
    };
    // Before any task, because a task is only ever sent once its counters exist.
    if let Some(sizes) = &sizes {
        tasks.create_counters(job, run_id, sizes).await?;
    }
    Ok((resumed_from, spread))
}

/// The counter tree for a run of `tasks`, when the producer does not choose one. `shards`
/// and `groups`, when given, override it. 0 shards means the run item counts (contract v1).
/// By default there is no tree under 100 tasks. Otherwise there is a shard per 16 tasks, at
/// most 16,384, and past 64 shards, a group per 64 shards. docs/performance.md has the model
/// behind these numbers.
pub fn sharding(tasks: u64, shards: Option<u32>, groups: Option<u32>) -> Option<Sharding> {
    let shards = match shards {
        Some(shards) => shards,
        None if tasks < 100 => 0,
        None => tasks.div_ceil(16).min(16_384) as u32,
    };
    let groups = groups.unwrap_or(if shards > 64 { shards.div_ceil(64) } else { 0 });
    (shards > 0).then_some(Sharding { shards, groups })
}

/// Checks that the run was created for as many URLs as this list has. If not, refuses,
/// naming the first line past the shorter of the two.
fn same_length(
    item: &conveyor_worker::store::dynamo::attributes::Item,
    run: RunRef<'_>,
    urls: &[(usize, String)],
) -> Result<(), StoreError> {
    let (job, run_id) = (run.job_id, run.run_id);
    let stored: Option<u64> = number(item, "tasks_total");
    let total = urls.len() as u64;
    let Some(stored) = stored.filter(|&stored| stored != total) else {
        return match stored {
            Some(_) => Ok(()),
            None => Err(refused(format!(
                "run {job}/{run_id} exists without a count of its tasks: not a submitted list"
            ))),
        };
    };
    let why = match urls.get(stored as usize) {
        Some((line, _)) => format!(
            "line {line}: this list has {total} URLs, run {job}/{run_id} was submitted with \
             {stored}: lines were added since"
        ),
        None => format!(
            "line {}: this list ends with {total} URLs, run {job}/{run_id} was submitted with \
             {stored}: lines were removed since",
            urls.last().map_or(0, |(line, _)| *line)
        ),
    };
    Err(refused(why))
}

/// Checks that the tasks an earlier submit wrote have the URLs of this list, read 100 at a
/// time. Refuses at the first line whose URL differs.
async fn same_list(
    tasks: &DynamoTaskStore,
    (job, run, spread): (&Id, &Id, Option<u32>),
    submitted: &[(usize, String)],
) -> Result<(), StoreError> {
    for chunk in submitted.chunks(100) {
        let refs: Vec<TaskRef> = chunk
            .iter()
            .map(|(line, _)| {
                TaskRef::new(job.clone(), run.clone(), task_id(*line)).spread_over(spread)
            })
            .collect();
        let stored = tasks.stored_urls(&refs).await?;
        for ((line, url), task) in chunk.iter().zip(&refs) {
            let was = stored.get(task.task_id.as_str());
            if was.is_some_and(|was| was != url) {
                return Err(refused(format!(
                    "line {line}: task {} exists with another URL: the list changed since it \
                     was first submitted",
                    task.task_id
                )));
            }
        }
    }
    Ok(())
}

/// The earlier run a refresh names: it must exist in the job.
async fn earlier_run<'a>(
    tasks: &DynamoTaskStore,
    job: &Id,
    earlier: &'a Id,
) -> Result<EarlierRun<'a>, StoreError> {
    match tasks.run_item(job, earlier).await? {
        Some(item) => Ok((earlier, spread_of(&item))),
        None => Err(refused(format!(
            "run {job}/{earlier} does not exist: there is nothing to refresh"
        ))),
    }
}

/// The earlier results of a chunk's tasks that a refresh can carry forward. Each comes from
/// the earlier run's task of the same line, if it succeeded with the same URL. Read 100 at a
/// time.
async fn earlier_results(
    tasks: &DynamoTaskStore,
    (job, (earlier, spread)): (&Id, EarlierRun<'_>),
    chunk: &[(usize, String)],
) -> Result<HashMap<String, Prior>, StoreError> {
    let refs: Vec<TaskRef> = chunk
        .iter()
        .map(|(line, _)| {
            TaskRef::new(job.clone(), earlier.clone(), task_id(*line)).spread_over(spread)
        })
        .collect();
    let mut found = tasks.earlier_results(&refs).await?;
    Ok(chunk
        .iter()
        .filter_map(|(line, url)| {
            let task = task_id(*line).as_str().to_owned();
            let (was, prior) = found.remove(&task)?;
            (was == *url).then_some((task, prior))
        })
        .collect())
}

/// Creates a chunk's tasks (a few at once), each with its earlier result if it has one. A
/// task that exists already must have the same URL.
async fn create_tasks(
    tasks: &DynamoTaskStore,
    (job, run, spread): (&Id, &Id, Option<u32>),
    (chunk, priors): (&[(usize, String)], &HashMap<String, Prior>),
    submitted: &mut Submitted,
) -> Result<Vec<TaskRef>, StoreError> {
    let creates = chunk.iter().map(|(line, url)| async move {
        let task = TaskRef::new(job.clone(), run.clone(), task_id(*line)).spread_over(spread);
        let prior = priors.get(task.task_id.as_str());
        match tasks.create_task(&task, url, prior).await? {
            Created::Written => Ok((task, true)),
            Created::Existing(item) if string(&item, "url") == Some(url.as_str()) => {
                Ok((task, false))
            }
            Created::Existing(_) => Err(refused(format!(
                "task {} (line {line}) exists with another URL: the list changed since it was \
                 first submitted",
                task.task_id
            ))),
        }
    });
    let created: Vec<(TaskRef, bool)> = stream::iter(creates)
        .buffered(PUTS_AT_ONCE)
        .try_collect()
        .await?;
    submitted.created += created.iter().filter(|(_, new)| *new).count() as u64;
    submitted.with_earlier += created
        .iter()
        .filter(|(task, new)| *new && priors.contains_key(task.task_id.as_str()))
        .count() as u64;
    Ok(created.into_iter().map(|(task, _)| task).collect())
}

/// Sends one message per task, ten to a request. What SQS does not take is sent again, up
/// to five times.
async fn send_all(queue: &SqsQueue, tasks: &[TaskRef]) -> Result<(), StoreError> {
    let sends = tasks.chunks(10).map(|batch| send_batch(queue, batch));
    stream::iter(sends)
        .buffer_unordered(4)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn send_batch(queue: &SqsQueue, batch: &[TaskRef]) -> Result<(), StoreError> {
    let mut unsent = batch.to_vec();
    for attempt in 0..5 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
        }
        unsent = queue.send_tasks(&unsent).await?;
        if unsent.is_empty() {
            return Ok(());
        }
    }
    let code = format!(
        "{} not taken after five tries (run submit again)",
        crate::count(unsent.len() as u64, "message")
    );
    let why = code.clone();
    Err(StoreError::failed(
        "SendMessageBatch",
        conveyor_worker::ports::error::StoreFault::Refused { code },
        why,
    ))
}

fn refused(detail: String) -> StoreError {
    StoreError::NotAllowed { detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_its_line_numbers_and_says_why_a_line_is_not_a_url() {
        let list = read_list(
            "https://example.com/a\n\n# a comment\nftp://example.com/b\n  http://example.com/c  \n\
             http://user:pw@example.com/\nnot a url\n",
        );

        assert_eq!(
            list.urls,
            [
                (1, "https://example.com/a".to_owned()),
                (5, "http://example.com/c".to_owned())
            ]
        );
        let lines: Vec<usize> = list.invalid.iter().map(|i| i.line).collect();
        assert_eq!(lines, [4, 6, 7]);
        assert!(list.invalid[0].why.contains("ftp"), "{:?}", list.invalid);
    }

    #[test]
    fn task_ids_come_from_line_numbers() {
        assert_eq!(task_id(42).as_str(), "t000042");
        assert_eq!(task_id(1_234_567).as_str(), "t1234567");
    }

    #[test]
    fn overlong_urls_are_refused() {
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_BYTES));
        assert!(check_url(&long).is_err());
    }
}
