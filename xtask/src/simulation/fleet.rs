//! The fleet in the simulation: slots each working one task at a time through the worker's
//! requests (guard read, parents read or a sandbox's cached yes, claim, fetch, S3 PUT, the
//! terminal transaction), with the worker's retries: conflicts tried again within the
//! invocation, throttling by the SDK, both then held back in the queue.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use conveyor_worker::retry::RetryPolicy;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, LogNormal};

use super::dynamo::{Answer, Micros, SECOND, Table, Target};
use super::{Counting, Outcome, Params, micros};

/// Request latencies (typical in-region figures; the model's assumption).
const GET: Micros = 4_000;
const BATCH_GET: Micros = 5_000;
const UPDATE: Micros = 6_000;
const TRANSACT: Micros = 15_000;
const S3_PUT: Micros = 30_000;
const S3_HEAD: Micros = 10_000;
/// A page's fetch: log-normal, median 800 ms (mean about 0.9 s).
const PAGE_MEDIAN_S: f64 = 0.8;
const PAGE_SIGMA: f64 = 0.5;
/// The SDK's standard retry (aws-smithy): 3 attempts, full jitter from 1 s, doubling.
const SDK_ATTEMPTS: u32 = 3;
const SDK_BACKOFF: Micros = SECOND;
/// The worker's hold-back of a record to retry (RETRY_BACKOFF_BASE_MS, _MAX_MS defaults).
const HOLD_BACK: Micros = 5 * SECOND;
const HOLD_BACK_MAX: Micros = 900 * SECOND;

/// The job's partition (the job and run items; the run is contended item 0).
const JOB: usize = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Act(usize),
    Free(usize),
    ParentsRead(usize),
    ReadParents(usize),
}

/// A task's message as the queue holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Message {
    id: u64,
    receives: u32,
    /// Its page is in S3 (a redelivery adopts it).
    stored: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    GetTask,
    Parents,
    Claim,
    Head,
    Fetch,
    Put,
    Finish(Finish),
}

/// The terminal transaction's step, as in `store::dynamo::shards` and `run_counters`: it counts the
/// task into its leaf and climbs the counter tree up to level `top`, each node below `top`
/// emptied by it; at the run, `complete` when this is its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Finish {
    top: usize,
    complete: bool,
}

const COUNT: Finish = Finish {
    top: 0,
    complete: false,
};

#[derive(Debug, Clone, Copy)]
struct Task {
    message: Message,
    step: Step,
    conflicts: u32,
    throttles: u32,
}

#[derive(Debug, Clone, Default)]
struct Sandbox {
    kept_until: Micros,
    reading: bool,
    waiting: Vec<usize>,
    read_throttles: u32,
}

/// What is left to count, as a tree: the leaves count tasks (the run item itself in v1,
/// else the shards), each node above counts its children not yet emptied, up to the run.
/// The child `i` of a level has the parent `i % len` on the next (`shard_of`, `group_of`).
#[derive(Debug, Clone)]
struct Tree {
    levels: Vec<Vec<u64>>,
    /// The first contended item of each level (the run is item 0, on the job's partition).
    first_item: Vec<usize>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    completions: u64,
    transactions: u64,
    conflicts: u64,
    throttles: u64,
    requests: u64,
}

pub(super) struct Fleet<'a> {
    params: &'a Params,
    rng: SmallRng,
    pages: LogNormal<f64>,
    conflict_retries: RetryPolicy,
    table: Table,
    now: Micros,
    warm: Micros,
    queue: BinaryHeap<Reverse<(Micros, u64, Event)>>,
    sequence: u64,
    slots: Vec<Option<Task>>,
    sandboxes: Vec<Sandbox>,
    held_back: BinaryHeap<Reverse<(Micros, Message)>>,
    /// Slots with nothing to take, and when one of them is woken for a held-back message.
    idle: Vec<usize>,
    waking: Option<Micros>,
    next_task: u64,
    tree: Tree,
    counts: Counts,
    /// The job partition's units at the end of the warm-up.
    job_at_warm: (f64, f64),
    completed_at: Option<Micros>,
}

impl<'a> Fleet<'a> {
    pub(super) fn new(params: &'a Params) -> Self {
        let tree = Tree::of(params);
        let items = tree.items();
        let partitions = items + params.task_partitions.unwrap_or(0) as usize;
        let slots = params.in_flight as usize;
        let mut fleet = Self {
            params,
            rng: SmallRng::seed_from_u64(params.seed),
            pages: LogNormal::new(PAGE_MEDIAN_S.ln(), PAGE_SIGMA).expect("a valid sigma"),
            conflict_retries: RetryPolicy::default(),
            table: match params.limits {
                true => Table::new(partitions, items, micros(params.hold_ms / 1e3)),
                false => Table::unlimited(partitions, items),
            },
            now: 0,
            warm: micros(params.warmup),
            queue: BinaryHeap::new(),
            sequence: 0,
            slots: vec![None; slots],
            sandboxes: vec![Sandbox::default(); slots.div_ceil(params.per_sandbox.max(1) as usize)],
            held_back: BinaryHeap::new(),
            idle: Vec::new(),
            waking: None,
            next_task: 0,
            tree,
            counts: Counts::default(),
            job_at_warm: (0.0, 0.0),
            completed_at: None,
        };
        // The fleet ramps up over its first second.
        for slot in 0..slots {
            let start = fleet.rng.random_range(0..SECOND);
            fleet.at(start, Event::Free(slot));
        }
        fleet
    }

    pub(super) fn run(mut self) -> Outcome {
        let end = micros(self.params.seconds);
        let mut warmed = false;
        while let Some(Reverse((at, _, event))) = self.queue.pop() {
            if at > end || self.completed_at.is_some() {
                break;
            }
            if !warmed && at >= self.warm {
                let job = &self.table.partitions[JOB];
                self.job_at_warm = (job.read_units, job.write_units);
                warmed = true;
            }
            self.now = at;
            match event {
                Event::Act(slot) => self.act(slot),
                Event::Free(slot) => self.free(slot),
                Event::ReadParents(sandbox) => self.read_parents(sandbox),
                Event::ParentsRead(sandbox) => self.parents_read(sandbox),
            }
        }
        self.outcome(end)
    }

    fn at(&mut self, at: Micros, event: Event) {
        self.sequence += 1;
        self.queue.push(Reverse((at, self.sequence, event)));
    }

    /// Counts what happens after the warm-up.
    fn count(&mut self, what: impl FnOnce(&mut Counts)) {
        if self.now >= self.warm {
            what(&mut self.counts);
        }
    }

    fn task(&mut self, slot: usize) -> &mut Task {
        self.slots[slot]
            .as_mut()
            .expect("a slot acts only while it works a task")
    }

    /// The slot takes the next message: one held back whose time has come, else a new task;
    /// with none, it waits idle until one is ready.
    fn free(&mut self, slot: usize) {
        self.slots[slot] = None;
        if self.waking == Some(self.now) {
            self.waking = None;
        }
        let message = match self.held_back.peek() {
            Some(Reverse((ready, _))) if *ready <= self.now => {
                self.held_back.pop().map(|Reverse((_, m))| m)
            }
            _ => self.fresh(),
        };
        match message {
            Some(message) => {
                self.slots[slot] = Some(Task {
                    message,
                    step: Step::GetTask,
                    conflicts: 0,
                    throttles: 0,
                });
                self.act(slot);
            }
            None => self.idle.push(slot),
        }
        self.wake();
    }

    /// One idle slot is woken for the earliest held-back message (not all of them: with
    /// thousands idle that would be thousands of events a message).
    fn wake(&mut self) {
        let Some(Reverse((ready, _))) = self.held_back.peek() else {
            return;
        };
        let ready = (*ready).max(self.now);
        if self.waking.is_some_and(|at| at <= ready) {
            return;
        }
        if let Some(slot) = self.idle.pop() {
            self.waking = Some(ready);
            self.at(ready, Event::Free(slot));
        }
    }

    fn fresh(&mut self) -> Option<Message> {
        if self.params.tasks.is_some_and(|t| self.next_task >= t) {
            return None;
        }
        self.next_task += 1;
        Some(Message {
            id: self.next_task - 1,
            receives: 1,
            stored: false,
        })
    }
}

/// The worker's requests, one step at a time.
impl Fleet<'_> {
    fn act(&mut self, slot: usize) {
        let task = *self.task(slot);
        let tasks = self.task_partition(task.message.id);
        let now = self.now;
        match task.step {
            Step::GetTask => {
                let answer = self.table.read(now, tasks, 1.0);
                self.answered(slot, answer, GET, Step::Parents);
            }
            Step::Parents => self.parents(slot),
            Step::Claim => {
                let answer = self.table.write(now, tasks, 1.0);
                let next = match task.message.receives {
                    1 => Step::Fetch,
                    _ => Step::Head,
                };
                self.answered(slot, answer, UPDATE, next);
            }
            Step::Head => {
                let next = match task.message.stored {
                    true => Step::Finish(COUNT),
                    false => Step::Fetch,
                };
                self.answered(slot, Answer::Done, S3_HEAD, next);
            }
            Step::Fetch => {
                let took = micros(self.pages.sample(&mut self.rng));
                self.then(slot, took, Step::Put);
            }
            Step::Put => {
                self.task(slot).message.stored = true;
                self.answered(slot, Answer::Done, S3_PUT, Step::Finish(COUNT));
            }
            Step::Finish(step) => self.finish(slot, step),
        }
    }

    /// The next step `after` this long.
    fn then(&mut self, slot: usize, after: Micros, next: Step) {
        self.task(slot).step = next;
        self.at(self.now + after, Event::Act(slot));
    }

    /// A request's answer: on to `next`, or throttled.
    fn answered(&mut self, slot: usize, answer: Answer, latency: Micros, next: Step) {
        self.count(|c| c.requests += 1);
        match answer {
            Answer::Throttled => self.throttled(slot, latency),
            _ => {
                self.task(slot).throttles = 0;
                self.then(slot, latency, next);
            }
        }
    }

    /// The SDK tries a throttled request again after a jittered pause, twice; then the
    /// record is left for retry.
    fn throttled(&mut self, slot: usize, latency: Micros) {
        self.count(|c| c.throttles += 1);
        let task = self.task(slot);
        task.throttles += 1;
        let tried = task.throttles;
        if tried >= SDK_ATTEMPTS {
            return self.hold_back(slot, latency);
        }
        let pause = self.jitter(SDK_BACKOFF << (tried - 1));
        self.at(self.now + latency + pause, Event::Act(slot));
    }

    /// A write that met a conflict is tried again after a jittered pause (the worker's
    /// `RetryPolicy`); past its tries, the record is left for retry.
    fn conflicted(&mut self, slot: usize) {
        self.count(|c| c.conflicts += 1);
        let task = self.task(slot);
        task.conflicts += 1;
        let tried = task.conflicts;
        let policy = self.conflict_retries;
        if tried >= policy.attempts {
            return self.hold_back(slot, TRANSACT);
        }
        let ceiling = (policy.base * (1 << (tried - 1).min(20))).min(policy.max_pause);
        let pause = self.jitter(ceiling.as_micros() as Micros);
        self.at(self.now + TRANSACT + pause, Event::Act(slot));
    }

    /// The record is reported for retry: held back in the queue (the worker's backoff, by
    /// receive), its slot free for the next message.
    fn hold_back(&mut self, slot: usize, after: Micros) {
        let mut message = self.task(slot).message;
        let ceiling = (HOLD_BACK << (message.receives - 1).min(20)).min(HOLD_BACK_MAX);
        message.receives += 1;
        let ready = self.now + after + self.jitter(ceiling);
        self.held_back.push(Reverse((ready, message)));
        self.at(self.now + after, Event::Free(slot));
        self.wake();
    }

    /// Full jitter: a random time up to `ceiling`.
    fn jitter(&mut self, ceiling: Micros) -> Micros {
        self.rng.random_range(0..=ceiling)
    }

    /// The partition of a task's item: one of the run's task partitions, or none that is hot.
    fn task_partition(&self, id: u64) -> Option<usize> {
        let first = self.tree.items();
        let partitions = self.params.task_partitions?;
        Some(first + (spread(id) % u64::from(partitions)) as usize)
    }
}

/// The parents read, and the sandbox's cache of its yes (`guard::ParentsCache`).
impl Fleet<'_> {
    fn parents(&mut self, slot: usize) {
        let Some(_) = self.params.parents_ttl_ms else {
            let answer = self.table.read(self.now, Some(JOB), 2.0);
            return self.answered(slot, answer, BATCH_GET, Step::Claim);
        };
        let sandbox = slot / self.params.per_sandbox.max(1) as usize;
        let kept = &mut self.sandboxes[sandbox];
        if kept.kept_until > self.now {
            return self.then(slot, 0, Step::Claim);
        }
        kept.waiting.push(slot);
        if !kept.reading {
            kept.reading = true;
            self.read_parents(sandbox);
        }
    }

    /// One read for the sandbox's waiting tasks; tried again while throttled.
    fn read_parents(&mut self, sandbox: usize) {
        self.count(|c| c.requests += 1);
        match self.table.read(self.now, Some(JOB), 2.0) {
            Answer::Throttled => {
                self.count(|c| c.throttles += 1);
                let kept = &mut self.sandboxes[sandbox];
                kept.read_throttles = (kept.read_throttles + 1).min(SDK_ATTEMPTS);
                let tries = kept.read_throttles;
                let pause = self.jitter(SDK_BACKOFF << (tries - 1));
                self.at(self.now + BATCH_GET + pause, Event::ReadParents(sandbox));
            }
            _ => {
                self.sandboxes[sandbox].read_throttles = 0;
                self.at(self.now + BATCH_GET, Event::ParentsRead(sandbox));
            }
        }
    }

    fn parents_read(&mut self, sandbox: usize) {
        let ttl = micros(self.params.parents_ttl_ms.unwrap_or(0.0) / 1e3);
        let kept = &mut self.sandboxes[sandbox];
        kept.kept_until = self.now + ttl;
        kept.reading = false;
        for slot in std::mem::take(&mut kept.waiting) {
            self.then(slot, 0, Step::Claim);
        }
    }
}

/// The terminal transaction, counted as `store::dynamo::run_counters` (v1) and `shards` (v2) count.
impl Fleet<'_> {
    fn finish(&mut self, slot: usize, step: Finish) {
        let id = self.task(slot).message.id;
        let task = Target {
            partition: self.task_partition(id),
            item: None,
        };
        let path = self.tree.path(id);
        let writes: Vec<(Target, f64)> = std::iter::once((task, 2.0))
            .chain(path[..=step.top].iter().map(|&item| {
                let target = Target {
                    partition: Some(item),
                    item: Some(item),
                };
                (target, 2.0)
            }))
            .collect();
        let holds = self.tree.holds(id, step);
        self.count(|c| {
            c.requests += 1;
            c.transactions += 1;
        });
        match self.table.transact(self.now, &writes, holds) {
            Answer::Done => self.counted(slot, id, step),
            Answer::Refused => {
                let next = self.tree.after_refusal(step);
                self.then(slot, TRANSACT, Step::Finish(next));
            }
            Answer::Conflict => self.conflicted(slot),
            Answer::Throttled => self.throttled(slot, TRANSACT),
        }
    }

    fn counted(&mut self, slot: usize, id: u64, step: Finish) {
        self.tree.count(id, step);
        if step.complete {
            self.completed_at = Some(self.now + TRANSACT);
        }
        self.count(|c| c.completions += 1);
        self.at(self.now + TRANSACT, Event::Free(slot));
    }

    fn outcome(&self, end: Micros) -> Outcome {
        let stop = self.completed_at.unwrap_or(end).min(end);
        let seconds = stop.saturating_sub(self.warm).max(1) as f64 / SECOND as f64;
        let c = self.counts;
        let per_task = |n: u64| n as f64 / c.completions.max(1) as f64;
        let job = &self.table.partitions[JOB];
        Outcome {
            completions_per_second: c.completions as f64 / seconds,
            conflict_rate: c.conflicts as f64 / c.transactions.max(1) as f64,
            throttled_per_task: per_task(c.throttles),
            requests_per_task: per_task(c.requests),
            job_reads_per_second: (job.read_units - self.job_at_warm.0) / seconds,
            job_writes_per_second: (job.write_units - self.job_at_warm.1) / seconds,
            completed_at: self.completed_at.map(|t| t as f64 / SECOND as f64),
        }
    }
}

/// A task id's spread over shards and partitions, as a hash spreads real ids (splitmix64).
fn spread(id: u64) -> u64 {
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Tree {
    /// The counters of a run of `params.tasks` (or of one that never ends).
    fn of(params: &Params) -> Self {
        let (shards, groups) = match params.counting {
            Counting::RunItem => (0, 0),
            Counting::Shards { shards, groups } => (shards, groups),
        };
        let tasks = params.tasks.unwrap_or(u64::MAX);
        let mut widths: Vec<u32> = [shards, groups].into_iter().filter(|n| *n > 0).collect();
        widths.push(1);
        let mut levels = vec![vec![0_u64; widths[0] as usize]];
        match params.tasks {
            None => levels[0].fill(u64::MAX),
            Some(_) => (0..tasks).for_each(|id| levels[0][leaf(id, widths[0])] += 1),
        }
        for width in &widths[1..] {
            let below = levels.last().expect("the leaves at least");
            let mut level = vec![0; *width as usize];
            for (child, left) in below.iter().enumerate() {
                level[child % *width as usize] += u64::from(*left > 0);
            }
            levels.push(level);
        }
        // Items: the run first (item 0, on the job's partition), then the levels below it.
        let mut first_item = vec![0; levels.len()];
        let mut next = 1;
        for level in (0..levels.len() - 1).rev() {
            first_item[level] = next;
            next += levels[level].len();
        }
        Self { levels, first_item }
    }

    /// Contended items (each on a partition of its own).
    fn items(&self) -> usize {
        self.levels.iter().map(Vec::len).sum()
    }

    /// The node of each level on a task's path, leaf first.
    fn nodes(&self, id: u64) -> Vec<usize> {
        let mut node = leaf(id, self.levels[0].len() as u32);
        let mut nodes = vec![node];
        for level in &self.levels[1..] {
            node %= level.len();
            nodes.push(node);
        }
        nodes
    }

    /// The items of a task's path, leaf first.
    fn path(&self, id: u64) -> Vec<usize> {
        let nodes = self.nodes(id);
        (0..nodes.len())
            .map(|l| self.first_item[l] + nodes[l])
            .collect()
    }

    /// Whether the step's conditions hold: every node below `top` at its last, `top` not
    /// (or, completing, the run at its last).
    fn holds(&self, id: u64, step: Finish) -> bool {
        let left = |l: usize| self.levels[l][self.nodes(id)[l]];
        (0..step.top).all(|l| left(l) == 1) && (left(step.top) == 1) == step.complete
    }

    /// A refusal's next step: one level up, or at the run, complete.
    fn after_refusal(&self, step: Finish) -> Finish {
        let run = self.levels.len() - 1;
        match step {
            Finish {
                top,
                complete: false,
            } if top < run => Finish {
                top: top + 1,
                complete: false,
            },
            Finish { top, .. } => Finish {
                top,
                complete: true,
            },
        }
    }

    fn count(&mut self, id: u64, step: Finish) {
        let nodes = self.nodes(id);
        for (level, node) in nodes.into_iter().enumerate().take(step.top + 1) {
            self.levels[level][node] -= 1;
        }
    }
}

/// A task's leaf among `width`.
fn leaf(id: u64, width: u32) -> usize {
    (spread(id) % u64::from(width)) as usize
}
