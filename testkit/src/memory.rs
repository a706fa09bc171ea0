//! In-process stand-ins for the ports, with the adapters' conditional semantics, for
//! benchmarks and fast tests where the emulator would be the bottleneck: tasks, jobs and
//! runs in a map (claims and terminal writes conditional on the status), result objects in a
//! map (first write wins), hold-backs recorded, pages served from memory after a delay.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use conveyor_worker::domain::bounds::Reason;
use conveyor_worker::domain::health::Trouble;
use conveyor_worker::domain::ids::RunRef;
use conveyor_worker::domain::ids::{QuarantineKey, ResultKey, TaskRef};
use conveyor_worker::domain::model::{
    Counting, Page, Parents, StoredResult, Task, TaskStatus, Terminal, Tries,
};
use conveyor_worker::domain::refresh::{Prior, Validators};
use conveyor_worker::domain::spend::{CountedIn, PaidLease, Reservation, Spend};
use conveyor_worker::polite::limits::{
    Ask, Booker, Grant, Host, HostState, Millis, Slot, Tail, decide, tail_after,
};
use conveyor_worker::ports::error::StoreError;
use conveyor_worker::ports::hosts::{HostStore, PushedBack, Robots, RobotsRecord, Taken};
use conveyor_worker::ports::queue::{MessageCopy, QueueRef, Visibility};
use conveyor_worker::ports::results::{
    Carried, Copied, Earlier, EarlierCheck, NewResult, Opening, Put, ResultStore,
};
use conveyor_worker::ports::spend::SpendStore;
use conveyor_worker::ports::tasks::{Claim, Finish, Lease, TaskStore, TriesFrom};
use conveyor_worker::scraper::{self, Fetched, Fetcher};
use conveyor_worker::worker::Worker;

use super::{WorkerTuning, task_ref};

/// The CPU benchmark's shape (benches/pipeline.rs), which `make bench` reports: the page
/// every task fetches, and the batch sizes (SQS's default and the largest a mapping hands over).
pub const CPU_PAGE_BYTES: usize = 16 * 1024;
pub const CPU_BATCHES: [usize; 2] = [10, 10_000];

/// The worker over in-process stores and `fetcher`.
pub type MemoryWorker<F> = Worker<MemoryTasks, MemoryResults, F, NoHold>;

/// A worker over in-process stores with `n` pending tasks, `t0` to `t{n-1}` of the test job
/// and run, whose pages are at `url`; settings as the emulator tests' defaults.
pub fn worker<F: Fetcher>(fetcher: F, n: usize, url: &str) -> MemoryWorker<F> {
    let worker = Worker::new(
        MemoryTasks::default(),
        MemoryResults::default(),
        fetcher,
        NoHold::default(),
        WorkerTuning::default().settings(),
    );
    for i in 0..n {
        worker
            .tasks
            .put(task_ref(&format!("t{i}")), url, TaskStatus::Pending);
    }
    worker
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Clone)]
struct MemoryTask {
    status: TaskStatus,
    url: Option<String>,
    tries: Tries,
    lease: Option<(String, SystemTime)>,
    terminal: Option<Terminal>,
}

/// Tasks of any job and run; every job is active and every run running.
#[derive(Debug, Default)]
pub struct MemoryTasks {
    tasks: Mutex<HashMap<TaskRef, MemoryTask>>,
    hosts: Mutex<HashMap<Host, HostState>>,
    robots: Mutex<HashMap<Host, (RobotsRecord, Millis)>>,
    /// Each host's paid-tier bytes used on robots.txt (held and spent), by day.
    robots_paid: Mutex<HashMap<(Host, String), u64>>,
    /// Requests served, like the adapter's one request per method.
    pub requests: AtomicU64,
    /// Spend recorded, by delivery (each counted once).
    pub spend: Mutex<HashMap<String, Spend>>,
}

impl MemoryTasks {
    pub fn put(&self, task: TaskRef, url: &str, status: TaskStatus) {
        let entry = MemoryTask {
            status,
            url: Some(url.to_owned()),
            tries: Tries::default(),
            lease: None,
            terminal: None,
        };
        lock(&self.tasks).insert(task, entry);
    }

    pub fn status(&self, task: &TaskRef) -> Option<TaskStatus> {
        lock(&self.tasks).get(task).map(|t| t.status)
    }

    fn served(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
}

impl TaskStore for MemoryTasks {
    async fn load_task(&self, task: &TaskRef) -> Result<Option<Task>, StoreError> {
        self.served();
        Ok(lock(&self.tasks).get(task).map(|t| Task {
            status: t.status,
            url: t.url.clone(),
            prior: None,
            tries: t.tries,
            render: None,
        }))
    }

    async fn load_parents(&self, _task: &TaskRef) -> Result<Parents, StoreError> {
        self.served();
        Ok(Parents {
            job_status: Some("active".into()),
            run_status: Some("running".into()),
            ..Parents::default()
        })
    }

    async fn claim(
        &self,
        task: &TaskRef,
        now: SystemTime,
        lease: Option<Lease<'_>>,
        tries: TriesFrom,
    ) -> Result<Claim, StoreError> {
        self.served();
        let mut tasks = lock(&self.tasks);
        let Some(entry) = tasks.get_mut(task) else {
            return Ok(Claim::Missing);
        };
        if entry.status.is_terminal() {
            return Ok(Claim::AlreadyTerminal);
        }
        if let (Some(lease), Some((owner, until))) = (lease, &entry.lease)
            && owner != lease.owner
            && *until > now
        {
            return Ok(Claim::Leased { until: *until });
        }
        let (was, found) = (entry.status, entry.tries);
        entry.status = TaskStatus::Processing;
        entry.tries = match (tries.fresh, tries.since) {
            (true, Some(since)) => Tries {
                attempts: 1,
                since: Some(since),
                spent: false,
                written: None,
            },
            _ => Tries {
                attempts: entry.tries.attempts + 1,
                since: entry.tries.since.or(tries.since),
                spent: entry.tries.spent,
                written: None,
            },
        };
        entry.lease = lease.map(|l| (l.owner.to_owned(), l.until));
        Ok(Claim::Claimed {
            attempts: entry.tries.attempts,
            was,
            url: entry.url.clone(),
            prior: None,
            tries: found,
        })
    }

    async fn unclaim(
        &self,
        task: &TaskRef,
        was: TaskStatus,
        owner: Option<&str>,
    ) -> Result<(), StoreError> {
        self.served();
        if let Some(entry) = lock(&self.tasks).get_mut(task)
            && entry.status == TaskStatus::Processing
        {
            entry.tries.attempts = entry.tries.attempts.saturating_sub(1);
            entry.status = was;
        }
        if let Some(owner) = owner {
            self.release_lease(task, owner);
        }
        Ok(())
    }

    async fn spend_tries(&self, task: &TaskRef, _reason: &Reason) -> Result<(), StoreError> {
        self.served();
        if let Some(entry) = lock(&self.tasks).get_mut(task)
            && !entry.status.is_terminal()
        {
            entry.tries.spent = true;
        }
        Ok(())
    }

    async fn release(&self, task: &TaskRef, owner: &str) -> Result<(), StoreError> {
        self.served();
        self.release_lease(task, owner);
        Ok(())
    }

    async fn finish(
        &self,
        task: &TaskRef,
        terminal: &Terminal,
        counted: CountedIn<'_>,
        _now: SystemTime,
    ) -> Result<Finish, StoreError> {
        let spend = counted.spend;
        self.served();
        let mut tasks = lock(&self.tasks);
        let replaces_failure = |entry: &MemoryTask| {
            entry.status == TaskStatus::Failed && terminal.status() == TaskStatus::Successful
        };
        match tasks.get_mut(task) {
            Some(entry) if !entry.status.is_terminal() || replaces_failure(entry) => {
                entry.status = terminal.status();
                entry.terminal = Some(terminal.clone());
                entry.lease = None;
                if !spend.spend.is_zero() {
                    // Under the delivery's name: its spend recorded alone after is the same.
                    lock(&self.spend).insert(spend.delivery.to_owned(), *spend.spend);
                }
                Ok(Finish::Written {
                    completed_run: false,
                    spend_counted: true,
                })
            }
            _ => Ok(Finish::LostRace),
        }
    }
}

impl MemoryTasks {
    fn release_lease(&self, task: &TaskRef, owner: &str) {
        if let Some(entry) = lock(&self.tasks).get_mut(task)
            && entry.lease.as_ref().is_some_and(|(held, _)| held == owner)
        {
            entry.lease = None;
        }
    }
}

/// Result objects (the first stored under a key wins) and the quarantine.
#[derive(Debug, Default)]
pub struct MemoryResults {
    /// What each stored object is; the bytes are dropped, as an upload would free them.
    objects: Mutex<HashMap<String, StoredResult>>,
    quarantined: Mutex<HashMap<String, Vec<u8>>>,
    pub requests: AtomicU64,
}

impl MemoryResults {
    pub fn stored(&self) -> usize {
        lock(&self.objects).len()
    }
}

impl ResultStore for MemoryResults {
    async fn put_if_absent(&self, new: NewResult<'_>) -> Result<Put, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut objects = lock(&self.objects);
        if objects.contains_key(new.key.as_str()) {
            return Ok(Put::AlreadyThere);
        }
        let described = StoredResult {
            key: new.key.clone(),
            sha256: new.sha256.to_owned(),
            size: new.page.body.len() as u64,
            http_status: new.page.http_status,
            content_type: new.page.content_type.clone(),
            final_url: new.page.final_url.clone(),
            validators: new.page.validators.clone(),
            not_modified: false,
            shell: new.shell.cloned(),
            rendered: new.page.rendered,
            render_reason: None,
        };
        objects.insert(new.key.as_str().to_owned(), described);
        Ok(Put::Stored)
    }

    async fn describe(&self, key: &ResultKey) -> Result<Option<StoredResult>, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(lock(&self.objects).get(key.as_str()).cloned())
    }

    /// The bytes are not kept: no opening to check (no block page is ever stored here).
    async fn opening(&self, key: &ResultKey, _most: usize) -> Result<Option<Opening>, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let stored = lock(&self.objects).get(key.as_str()).cloned();
        Ok(stored.map(|stored| Opening {
            bytes: Vec::new(),
            etag: stored.sha256,
        }))
    }

    async fn replace(&self, new: NewResult<'_>, etag: &str) -> Result<Put, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut objects = lock(&self.objects);
        let Some(stored) = objects
            .get_mut(new.key.as_str())
            .filter(|s| s.sha256 == etag)
        else {
            return Ok(Put::AlreadyThere);
        };
        stored.sha256 = new.sha256.to_owned();
        stored.size = new.page.body.len() as u64;
        Ok(Put::Stored)
    }

    async fn check_earlier(&self, prior: &Prior) -> Result<EarlierCheck, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(match lock(&self.objects).get(prior.key.as_str()) {
            Some(stored) if stored.sha256 == prior.sha256.as_str() => {
                EarlierCheck::Usable(Box::new(Earlier {
                    version: stored.sha256.clone(),
                    stored: stored.clone(),
                }))
            }
            Some(_) => EarlierCheck::Unusable("another object".into()),
            None => EarlierCheck::Unusable("gone".into()),
        })
    }

    async fn carry_if_absent(&self, carried: Carried<'_>) -> Result<Copied, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut objects = lock(&self.objects);
        if objects.contains_key(carried.key.as_str()) {
            return Ok(Copied::AlreadyThere);
        }
        let stored = StoredResult {
            key: carried.key.clone(),
            validators: carried.validators.clone(),
            not_modified: true,
            ..carried.earlier.stored.clone()
        };
        objects.insert(carried.key.as_str().to_owned(), stored);
        Ok(Copied::Stored)
    }

    async fn carry_replacing(
        &self,
        carried: Carried<'_>,
        etag: &str,
    ) -> Result<Copied, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut objects = lock(&self.objects);
        let Some(stored) = objects
            .get_mut(carried.key.as_str())
            .filter(|s| s.sha256 == etag)
        else {
            return Ok(Copied::AlreadyThere);
        };
        *stored = StoredResult {
            key: carried.key.clone(),
            validators: carried.validators.clone(),
            not_modified: true,
            ..carried.earlier.stored.clone()
        };
        Ok(Copied::Stored)
    }

    async fn quarantine(&self, key: &QuarantineKey, document: Vec<u8>) -> Result<(), StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        lock(&self.quarantined).insert(key.as_str().to_owned(), document);
        Ok(())
    }
}

/// The hosts' shared state in one process: the schedule's rule applied under a lock, as
/// the adapter's conditions apply it in DynamoDB.
impl SpendStore for MemoryTasks {
    async fn record_spend(
        &self,
        _task: &TaskRef,
        _counting: Counting,
        spend: &Spend,
        delivery: &str,
    ) -> Result<(), StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        lock(&self.spend).insert(delivery.to_owned(), *spend);
        Ok(())
    }

    async fn reserve_paid(
        &self,
        _run: RunRef<'_>,
        _lease: &PaidLease,
        _chunk: u64,
    ) -> Result<Reservation, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(Reservation::Granted)
    }

    async fn note_paid(
        &self,
        _task: &TaskRef,
        _holder: &str,
        _bytes: u64,
        _delivery: &str,
    ) -> Result<(), StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn return_paid(
        &self,
        _run: RunRef<'_>,
        _holder: &str,
        _unnoted: u64,
    ) -> Result<(), StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn reclaim_paid(&self, _run: RunRef<'_>, _now_ms: u64) -> Result<usize, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    }
}

impl HostStore for MemoryTasks {
    async fn take_host(
        &self,
        host: &Host,
        ask: &Ask,
        _seen: &HostState,
        booker: Option<&Booker>,
    ) -> Result<Taken, StoreError> {
        self.served();
        let mut hosts = lock(&self.hosts);
        let state = hosts.entry(host.clone()).or_default();
        let ask = ask.repicked(state);
        let (grant, mut after) = decide(state, &ask);
        if let (Grant::StartAt(start), Some(_), Some(booker)) = (grant, ask.interval, booker) {
            let next = after.next_start.unwrap_or(start);
            after.tail = Some(tail_after(state, booker, start, next));
        }
        *state = after.clone();
        let slot = matches!(grant, Grant::StartAt(_))
            .then_some(ask.slot)
            .flatten();
        Ok((grant, after, slot))
    }

    async fn give_back(
        &self,
        host: &Host,
        tail: &Tail,
        to: Millis,
        now: Millis,
    ) -> Result<bool, StoreError> {
        self.served();
        let mut hosts = lock(&self.hosts);
        let state = hosts.entry(host.clone()).or_default();
        if state.tail.as_ref() != Some(tail) || state.next_start != Some(tail.until) {
            return Ok(false);
        }
        state.next_start = Some(to);
        state.tail = None;
        state.given_back = Some((to, now));
        Ok(true)
    }

    async fn booker_wants_work(&self, _booker: &Booker) -> Result<bool, StoreError> {
        self.served();
        Ok(true)
    }

    async fn host(&self, host: &Host) -> Result<HostState, StoreError> {
        self.served();
        Ok(lock(&self.hosts).get(host).cloned().unwrap_or_default())
    }

    async fn leave_host(
        &self,
        host: &Host,
        slot: Slot,
        answers: Option<(f64, f64)>,
    ) -> Result<(), StoreError> {
        self.served();
        let mut hosts = lock(&self.hosts);
        let state = hosts.entry(host.clone()).or_default();
        if state.slot_until(slot.index) == slot.until {
            state.slots[slot.index] = None;
            state.answers = answers.or(state.answers);
            if answers.is_some() {
                state.failing_until = None;
            }
        }
        Ok(())
    }

    async fn push_back(
        &self,
        host: &Host,
        seen: &HostState,
        trouble: Trouble,
        now: Millis,
    ) -> Result<PushedBack, StoreError> {
        self.served();
        let mut hosts = lock(&self.hosts);
        let state = hosts.entry(host.clone()).or_default();
        let longer_stands = trouble.cooldown_until.is_some_and(|until| {
            state
                .cooldown_until
                .is_some_and(|standing| standing >= until)
        });
        let moved = trouble.slowdown.is_some() && state.slowdown != seen.slowdown;
        if longer_stands || moved {
            return Ok(PushedBack::Refused(Box::new(state.clone())));
        }
        state.cooldown_until = trouble.cooldown_until.or(state.cooldown_until);
        state.cooldown_ms = trouble.cooldown_ms.or(state.cooldown_ms);
        state.failing_until = trouble.failing_until.or(state.failing_until);
        if let Some(slowdown) = trouble.slowdown {
            state.slowdown = Some((slowdown, now));
            state.knee = trouble.knee;
            state.next_start = trouble.next_start.or(state.next_start);
        }
        Ok(PushedBack::Recorded)
    }

    async fn robots(&self, host: &Host) -> Result<Option<RobotsRecord>, StoreError> {
        self.served();
        Ok(lock(&self.robots)
            .get(host)
            .map(|(record, _)| record.clone()))
    }

    async fn take_robots_fetch(
        &self,
        host: &Host,
        now: Millis,
        until: Millis,
    ) -> Result<bool, StoreError> {
        self.served();
        let mut robots = lock(&self.robots);
        let taken = robots
            .get(host)
            .is_some_and(|(r, lease)| r.expires_at > now || *lease > now);
        if !taken {
            let stale = RobotsRecord {
                rules: Robots::Unavailable,
                expires_at: 0,
                failures: 0,
            };
            let record = robots.get(host).map_or(stale, |(r, _)| r.clone());
            robots.insert(host.clone(), (record, until));
        }
        Ok(!taken)
    }

    async fn put_robots(
        &self,
        host: &Host,
        record: RobotsRecord,
    ) -> Result<RobotsRecord, StoreError> {
        self.served();
        lock(&self.robots).insert(host.clone(), (record.clone(), 0));
        Ok(record)
    }

    async fn hold_robots_paid(
        &self,
        host: &Host,
        day: &str,
        (hold, budget): (u64, u64),
    ) -> Result<bool, StoreError> {
        self.served();
        let mut paid = lock(&self.robots_paid);
        let used = paid.entry((host.clone(), day.to_owned())).or_default();
        let room = used.saturating_add(hold) <= budget;
        if room {
            *used += hold;
        }
        Ok(room)
    }

    async fn settle_robots_paid(
        &self,
        host: &Host,
        day: &str,
        (hold, spent): (u64, u64),
    ) -> Result<(), StoreError> {
        self.served();
        let mut paid = lock(&self.robots_paid);
        let used = paid.entry((host.clone(), day.to_owned())).or_default();
        *used = used.saturating_sub(hold).saturating_add(spent);
        Ok(())
    }
}

/// Hold-backs and fresh copies, counted (the copies kept) and otherwise ignored.
#[derive(Debug, Default)]
pub struct NoHold {
    pub holds: AtomicU64,
    pub requeued: AtomicU64,
    sent: Mutex<Vec<MessageCopy>>,
}

impl NoHold {
    /// The fresh copies sent, in order.
    pub fn copies(&self) -> Vec<MessageCopy> {
        lock(&self.sent).clone()
    }
}

impl Visibility for NoHold {
    async fn hold(
        &self,
        _queue: &QueueRef,
        _receipt_handle: &str,
        _delay: Duration,
    ) -> Result<(), StoreError> {
        self.holds.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn requeue(&self, _queue: &QueueRef, copy: &MessageCopy) -> Result<(), StoreError> {
        self.requeued.fetch_add(1, Ordering::Relaxed);
        lock(&self.sent).push(copy.clone());
        Ok(())
    }
}

/// Serves every URL with the same body after `delay` (none: at once), as a page would.
#[derive(Debug, Clone)]
pub struct MemoryPages {
    pub body: Bytes,
    pub delay: Duration,
}

impl Fetcher for MemoryPages {
    /// The page, checked for block pages as a fetched page is (no headers here: the body).
    async fn fetch(&self, url: &str, ask: scraper::Ask<'_>) -> Fetched {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if let Some(block) = ask.detection.by_body(Some("text/html"), &self.body) {
            return Fetched::unspent(Err(scraper::FetchError::blocked_by(block, 200)));
        }
        Fetched::unspent(Ok(Page {
            url: url.to_owned(),
            http_status: 200,
            final_url: url.into(),
            content_type: "text/html".into(),
            body: self.body.clone(),
            validators: Validators::default(),
            rendered: None,
            screenshot: None,
        }))
    }
}
