//! The fleet in the simulation: slots each working one task at a time through the worker's
//! requests (guard read, parents read or a sandbox's cached yes, claim, fetch, S3 PUT, the
//! terminal transaction), with the worker's retries: conflicts tried again within the
//! invocation, throttling by the SDK, both then held back in the queue (a pushed-back
//! record for at least half its ceiling), a final receive sent again as a fresh copy.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use conveyor_worker::pushback::retry::RetryPolicy;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, LogNormal};

use super::capacity::Mapping;
use super::dynamo::{Answer, Micros, SECOND, Table, Target};
use super::held::Held;
use super::places::{JOB, Places, spread};
use super::{Counting, Outcome, Params, TIMELINE_BIN_S, micros};

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
/// The terminal write, throttled past the SDK's attempts, is tried again in the record
/// (`retry::FINISH_THROTTLED`): rounds of the SDK's attempts, full-jitter pauses between
/// them from 1 s, doubling, to 8 s; then the record is held like any other.
const FINISH_ROUNDS: u32 = 4;
const FINISH_PAUSE: Micros = 4 * SECOND;
const FINISH_PAUSE_MAX: Micros = 8 * SECOND;
/// The worker's hold-back of a record to retry (RETRY_BACKOFF_BASE_MS, _MAX_MS defaults).
const HOLD_BACK: Micros = 5 * SECOND;
const HOLD_BACK_MAX: Micros = 900 * SECOND;
/// Receives of a record (MAX_ATTEMPTS); a final one that failed for a reason of ours is sent
/// again as a fresh copy, up to `MAX_COPIES` (`worker::MAX_COPIES`), then dead-lettered.
const MAX_ATTEMPTS: u32 = 5;
const MAX_COPIES: u32 = 10;
/// Copies for AWS's push-back are bounded by time instead (`worker::PRESSED_COPIES_FOR`).
const PRESSED_COPIES_FOR: Micros = 2 * 3_600 * SECOND;
/// A batch read's rounds for keys left unprocessed: 50 ms, doubling, half to all of it.
const UNPROCESSED_ROUNDS: u32 = 5;
const UNPROCESSED_PAUSE: Micros = 50_000;

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
    /// Fresh copies sent of it after final receives.
    copies: u32,
    /// When its first copy for AWS's push-back was sent.
    pressed_since: Option<Micros>,
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
    /// When the record took its turn.
    started: Micros,
}

#[derive(Debug, Clone, Default)]
struct Sandbox {
    kept_until: Micros,
    reading: bool,
    waiting: Vec<usize>,
    read_throttles: u32,
    /// The worker's pressure (AIMD): records at once, `None` while AWS has not pushed back.
    limit: Option<f64>,
    /// The records at work when the limit was first cut: past it, no limit again.
    ceiling: f64,
    active: usize,
    last_cut: Option<Micros>,
    /// Under one record at once: no record starts before this.
    resting_until: Micros,
    /// Slots of the sandbox waiting for their turn.
    parked: Vec<usize>,
}

/// The worker's pressure halves at most once this long (`pressure::CUT_EVERY`), to at least
/// this share of one record (`pressure::LEAST`).
const CUT_EVERY: Micros = SECOND;
const LEAST: f64 = 1.0 / 16.0;

impl Sandbox {
    fn has_room(&self, now: Micros) -> bool {
        match self.limit {
            None => true,
            Some(l) if l >= 1.0 => (self.active as f64) < l.floor(),
            Some(_) => self.active == 0 && now >= self.resting_until,
        }
    }

    /// A record that took `took` ended at `now`: under one record at once, the sandbox
    /// rests so that it works `limit` of the time (`pressure::Turn`'s drop).
    fn ended(&mut self, now: Micros, took: Micros) {
        if let Some(l) = self.limit.filter(|l| *l < 1.0) {
            self.resting_until = now + (took as f64 * (1.0 / l - 1.0)) as Micros;
        }
    }

    fn cut(&mut self, now: Micros) {
        if self.last_cut.is_some_and(|at| now < at + CUT_EVERY) {
            return;
        }
        let current = match self.limit {
            Some(limit) => limit,
            None => {
                self.ceiling = self.active.max(1) as f64;
                self.ceiling
            }
        };
        self.limit = Some((current / 2.0).max(LEAST));
        self.last_cut = Some(now);
    }

    /// How far the limit is below the records it was cut from (1: not cut), which bounds a
    /// pushed-back record's hold (`pressure::Pressure::strain`).
    fn strain(&self) -> f64 {
        self.limit.map_or(1.0, |l| self.ceiling / l)
    }

    /// +1/limit (under one record, +`LEAST`); whether a record more may work now.
    fn grow(&mut self) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        let grown = match limit < 1.0 {
            true => limit + LEAST,
            false => limit + 1.0 / limit,
        };
        self.limit = (grown < self.ceiling).then_some(grown);
        self.limit.is_none_or(|l| l.floor() > limit.floor())
    }
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
    slow_downs: u64,
    puts: u64,
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
    held_back: Held<Message>,
    /// Slots with nothing to take, and when one of them is woken for a held-back message.
    idle: Vec<usize>,
    waking: Option<Micros>,
    next_task: u64,
    tree: Tree,
    counts: Counts,
    /// The job partition's units at the end of the warm-up.
    job_at_warm: (f64, f64),
    /// The table's units granted at the end of the warm-up.
    units_at_warm: (f64, f64),
    completed_at: Option<Micros>,
    places: Places,
    timeline: Vec<u64>,
    dead_letters: u64,
}

impl<'a> Fleet<'a> {
    pub(super) fn new(params: &'a Params) -> Self {
        let tree = Tree::of(params);
        let items = tree.items();
        let (places, partitions) = Places::new(params, items);
        let mapping = params.fresh.map_or(Mapping::Fixed, |f| f.mapping);
        let slots = match mapping {
            Mapping::Fixed => params.in_flight as usize,
            _ => (mapping.most() * params.per_sandbox) as usize,
        };
        let mut fleet = Self {
            params,
            rng: SmallRng::seed_from_u64(params.seed),
            pages: LogNormal::new(PAGE_MEDIAN_S.ln(), PAGE_SIGMA).expect("a valid sigma"),
            conflict_retries: RetryPolicy::default(),
            table: table(params, partitions, items),
            now: 0,
            warm: micros(params.warmup),
            queue: BinaryHeap::new(),
            sequence: 0,
            slots: vec![None; slots],
            sandboxes: vec![Sandbox::default(); slots.div_ceil(params.per_sandbox.max(1) as usize)],
            held_back: Held::default(),
            idle: Vec::new(),
            waking: None,
            next_task: 0,
            tree,
            counts: Counts::default(),
            job_at_warm: (0.0, 0.0),
            units_at_warm: (0.0, 0.0),
            completed_at: None,
            places,
            timeline: Vec::new(),
            dead_letters: 0,
        };
        fleet.start_slots(mapping, slots);
        fleet
    }

    /// A fixed fleet ramps up over its first second; else each sandbox's records start when
    /// the mapping adds its invocation (spread over the 100 ms after).
    fn start_slots(&mut self, mapping: Mapping, slots: usize) {
        let per_sandbox = self.params.per_sandbox.max(1) as usize;
        for slot in 0..slots {
            let start = match mapping {
                Mapping::Fixed => self.rng.random_range(0..SECOND),
                _ => {
                    let invocation = (slot / per_sandbox) as u32;
                    mapping.start_of(invocation) + self.rng.random_range(0..SECOND / 10)
                }
            };
            self.at(start, Event::Free(slot));
        }
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
                self.units_at_warm = self.table.units;
                warmed = true;
            }
            self.now = at;
            self.places.follow(at, &mut self.table);
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
        let sandbox = self.sandbox_of(slot);
        if let Some(task) = self.slots[slot].take() {
            let kept = &mut self.sandboxes[sandbox];
            kept.active -= 1;
            kept.ended(self.now, self.now - task.started);
            self.unpark(sandbox);
        }
        if self.waking == Some(self.now) {
            self.waking = None;
        }
        if self.params.aimd && !self.sandboxes[sandbox].has_room(self.now) {
            let kept = &mut self.sandboxes[sandbox];
            // Resting with nothing at work: the record that ended takes the next turn.
            match kept.active == 0 && kept.resting_until > self.now {
                true => {
                    let rested = kept.resting_until;
                    self.at(rested, Event::Free(slot));
                }
                false => kept.parked.push(slot),
            }
            return;
        }
        let message = match self.held_back.pop_ready(self.now) {
            Some(message) => Some(message),
            None => self.fresh(),
        };
        match message {
            Some(message) => {
                self.sandboxes[sandbox].active += 1;
                self.slots[slot] = Some(Task {
                    message,
                    step: Step::GetTask,
                    conflicts: 0,
                    throttles: 0,
                    started: self.now,
                });
                self.act(slot);
            }
            None => self.idle.push(slot),
        }
        self.wake();
    }

    fn sandbox_of(&self, slot: usize) -> usize {
        slot / self.params.per_sandbox.max(1) as usize
    }

    /// A parked slot of the sandbox takes its turn, if the sandbox has room for it.
    fn unpark(&mut self, sandbox: usize) {
        let kept = &mut self.sandboxes[sandbox];
        if kept.has_room(self.now)
            && let Some(slot) = kept.parked.pop()
        {
            self.at(self.now, Event::Free(slot));
        }
    }

    /// One idle slot is woken for the earliest held-back message (not all of them: with
    /// thousands idle that would be thousands of events a message).
    fn wake(&mut self) {
        let Some(ready) = self.held_back.next_ready() else {
            return;
        };
        let ready = ready.max(self.now);
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
            copies: 0,
            pressed_since: None,
        })
    }
}

/// The worker's requests, one step at a time.
impl Fleet<'_> {
    fn act(&mut self, slot: usize) {
        let task = *self.task(slot);
        let tasks = self.places.task(task.message.id);
        let now = self.now;
        match task.step {
            Step::GetTask => {
                self.places.ask_task(now, 1.0 / 3.0);
                let answer = self.table.read(now, tasks, 1.0);
                self.answered(slot, answer, GET, Step::Parents);
            }
            Step::Parents => self.parents(slot),
            Step::Claim => {
                self.places.ask_task(now, 1.0);
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
            Step::Put => self.put(slot),
            Step::Finish(step) => self.finish(slot, step),
        }
    }

    /// The result's PUT: its prefix takes it, or answers 503 SlowDown (retried as a
    /// throttled request is).
    fn put(&mut self, slot: usize) {
        let id = self.task(slot).message.id;
        if !self.places.put(self.now, id) {
            self.count(|c| c.slow_downs += 1);
            return self.answered(slot, Answer::Throttled, S3_PUT, Step::Put);
        }
        self.count(|c| c.puts += 1);
        self.task(slot).message.stored = true;
        self.answered(slot, Answer::Done, S3_PUT, Step::Finish(COUNT));
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
    /// record is left for retry, but for the terminal write, tried again in rounds first.
    fn throttled(&mut self, slot: usize, latency: Micros) {
        self.count(|c| c.throttles += 1);
        let task = self.task(slot);
        task.throttles += 1;
        let tried = task.throttles;
        let rounds = match task.step {
            Step::Finish(_) => FINISH_ROUNDS,
            _ => 1,
        };
        let round = tried.div_ceil(SDK_ATTEMPTS);
        let pause = match tried % SDK_ATTEMPTS {
            0 if round >= rounds => return self.hold_back(slot, latency, true),
            0 => (FINISH_PAUSE << (round - 1)).min(FINISH_PAUSE_MAX),
            within => SDK_BACKOFF << (within - 1),
        };
        let pause = self.jitter(pause);
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
            return self.hold_back(slot, TRANSACT, false);
        }
        let ceiling = (policy.base * (1 << (tried - 1).min(20))).min(policy.max_pause);
        let pause = self.jitter(ceiling.as_micros() as Micros);
        self.at(self.now + TRANSACT + pause, Event::Act(slot));
    }

    /// The record is reported for retry: held back in the queue (the worker's backoff, by
    /// receive: `pressed`, AWS pushed back, at least half the ceiling; a conflict, full
    /// jitter), its slot free for the next message. A final receive is sent again as a fresh
    /// copy after the same hold (its receives kept), until its copies are spent (pushed back,
    /// until 2 h from its first such copy). A pushed-back hold is at most the sandbox's strain
    /// times the base, as the worker's `Backoff::pressed` is.
    fn hold_back(&mut self, slot: usize, after: Micros, pressed: bool) {
        let sandbox = self.sandbox_of(slot);
        // The hold is set before the record's own cut, as the worker's is.
        let strain = self.sandboxes[sandbox].strain();
        if pressed && self.params.aimd {
            self.sandboxes[sandbox].cut(self.now);
        }
        let message = self.task(slot).message;
        self.at(self.now + after, Event::Free(slot));
        let pressed = pressed.then_some(strain);
        self.hold(message, after, pressed);
    }

    /// `pressed`: AWS pushed back, and the sandbox's strain then (`Sandbox::strain`).
    fn hold(&mut self, mut message: Message, after: Micros, pressed: Option<f64>) {
        // A copy has come back as often as its receives and copies together: it waits longer.
        let tries = message.receives - 1 + message.copies;
        let ceiling = (HOLD_BACK << tries.min(20)).min(HOLD_BACK_MAX);
        let hold = match pressed {
            Some(strain) => {
                let ceiling = match self.params.aimd {
                    true => ceiling.min((HOLD_BACK as f64 * strain) as Micros),
                    false => ceiling,
                };
                ceiling / 2 + self.jitter(ceiling / 2)
            }
            None => self.jitter(ceiling),
        };
        let copy_window = |since: Micros| self.now < since + PRESSED_COPIES_FOR;
        let may_copy = match pressed {
            Some(_) => message.pressed_since.is_none_or(copy_window),
            None => message.copies < MAX_COPIES,
        };
        if message.receives < MAX_ATTEMPTS {
            message.receives += 1;
        } else if may_copy {
            message.copies += 1;
            if pressed.is_some() {
                message.pressed_since.get_or_insert(self.now);
            }
        } else {
            self.dead_letters += 1;
            return;
        }
        self.held_back.push(self.now + after + hold, message);
        self.wake();
    }

    /// Full jitter: a random time up to `ceiling`.
    fn jitter(&mut self, ceiling: Micros) -> Micros {
        self.rng.random_range(0..=ceiling)
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
            self.task(slot).step = Step::Claim;
            return self.act(slot);
        }
        kept.waiting.push(slot);
        if !kept.reading {
            kept.reading = true;
            self.read_parents(sandbox);
        }
    }

    /// One read for the sandbox's waiting tasks; keys left unprocessed (throttled) asked
    /// again after a growing pause, half to all of 50 ms doubling, five rounds; then its
    /// records are held back as pushed back.
    fn read_parents(&mut self, sandbox: usize) {
        self.count(|c| c.requests += 1);
        match self.table.read(self.now, Some(JOB), 2.0) {
            Answer::Throttled => {
                self.count(|c| c.throttles += 1);
                let kept = &mut self.sandboxes[sandbox];
                kept.read_throttles += 1;
                let round = kept.read_throttles;
                if round > UNPROCESSED_ROUNDS {
                    return self.parents_failed(sandbox);
                }
                let ceiling = UNPROCESSED_PAUSE << (round - 1);
                let pause = ceiling / 2 + self.jitter(ceiling / 2);
                self.at(self.now + BATCH_GET + pause, Event::ReadParents(sandbox));
            }
            _ => {
                self.sandboxes[sandbox].read_throttles = 0;
                self.at(self.now + BATCH_GET, Event::ParentsRead(sandbox));
            }
        }
    }

    /// The parents read was throttling: the sandbox's waiting records are held back.
    fn parents_failed(&mut self, sandbox: usize) {
        let kept = &mut self.sandboxes[sandbox];
        kept.read_throttles = 0;
        kept.reading = false;
        for slot in std::mem::take(&mut kept.waiting) {
            self.hold_back(slot, BATCH_GET, true);
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
            partition: self.places.task(id),
            item: None,
        };
        self.places.ask_task(self.now, 2.0);
        let path = self.tree.path(id);
        let mut writes = [(task, 2.0); LEVELS + 1];
        for (write, &item) in writes[1..].iter_mut().zip(&path[..=step.top]) {
            let target = Target {
                partition: Some(self.places.item(item)),
                item: Some(item),
            };
            *write = (target, 2.0);
        }
        let writes = &writes[..step.top + 2];
        let holds = self.tree.holds(id, step);
        self.count(|c| {
            c.requests += 1;
            c.transactions += 1;
        });
        match self.table.transact(self.now, writes, holds) {
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
        let bin = ((self.now + TRANSACT) / (TIMELINE_BIN_S * SECOND)) as usize;
        if self.timeline.len() <= bin {
            self.timeline.resize(bin + 1, 0);
        }
        self.timeline[bin] += 1;
        if self.params.aimd {
            let sandbox = self.sandbox_of(slot);
            if self.sandboxes[sandbox].grow() {
                self.unpark(sandbox);
            }
        }
        self.at(self.now + TRANSACT, Event::Free(slot));
    }

    fn outcome(&self, end: Micros) -> Outcome {
        let stop = self.completed_at.unwrap_or(end).min(end);
        let seconds = stop.saturating_sub(self.warm).max(1) as f64 / SECOND as f64;
        let c = self.counts;
        let per_task = |n: u64| n as f64 / c.completions.max(1) as f64;
        let job = &self.table.partitions[JOB];
        let (reads, writes) = self.table.units;
        let (key_splits, prefix_splits) = self.places.splits();
        Outcome {
            timeline: self.timeline.clone(),
            write_units_per_task: (writes - self.units_at_warm.1) / c.completions.max(1) as f64,
            read_units_per_task: (reads - self.units_at_warm.0) / c.completions.max(1) as f64,
            puts_per_task: per_task(c.puts),
            slow_downs_per_task: per_task(c.slow_downs),
            dead_letters: self.dead_letters,
            key_splits,
            prefix_splits,
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

/// The table of `params`: with its partitions' limits or none (the floor), and a fresh
/// run's on-demand rates.
fn table(params: &Params, partitions: usize, items: usize) -> Table {
    let table = match params.limits {
        true => Table::new(partitions, items, micros(params.hold_ms / 1e3)),
        false => return Table::unlimited(partitions, items),
    };
    match params.fresh {
        Some(fresh) => table.on_demand(fresh.warm_read, fresh.warm_write, fresh.debt),
        None => table,
    }
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

    /// The node of each level on a task's path, leaf first (at most `LEVELS` of them:
    /// shards, groups, the run).
    fn nodes(&self, id: u64) -> [usize; LEVELS] {
        let mut node = leaf(id, self.levels[0].len() as u32);
        let mut nodes = [0; LEVELS];
        nodes[0] = node;
        for (l, level) in self.levels.iter().enumerate().skip(1) {
            node %= level.len();
            nodes[l] = node;
        }
        nodes
    }

    /// The items of a task's path, leaf first (the first `levels.len()` of them).
    fn path(&self, id: u64) -> [usize; LEVELS] {
        let mut path = self.nodes(id);
        for (l, node) in path.iter_mut().enumerate().take(self.levels.len()) {
            *node += self.first_item[l];
        }
        path
    }

    /// Whether the step's conditions hold: every node below `top` at its last, `top` not
    /// (or, completing, the run at its last).
    fn holds(&self, id: u64, step: Finish) -> bool {
        let nodes = self.nodes(id);
        let left = |l: usize| self.levels[l][nodes[l]];
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

/// Levels of a counter tree at most: shards, groups, the run.
const LEVELS: usize = 3;

/// A task's leaf among `width`.
fn leaf(id: u64, width: u32) -> usize {
    (spread(id) % u64::from(width)) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(receives: u32, copies: u32) -> Message {
        Message {
            id: 7,
            receives,
            stored: false,
            copies,
            pressed_since: None,
        }
    }

    /// Holds `message` `n` times; each comes back as what, and after how long. Pressed, the
    /// sandbox's strain as high as can be (the hold bounded by its receives alone).
    fn held(pressed: bool, message: Message, n: usize) -> Vec<(Message, Micros)> {
        let params = Params::default();
        let mut fleet = Fleet::new(&params);
        fleet.now = 3 * 3_600 * SECOND;
        for _ in 0..n {
            fleet.hold(message, 0, pressed.then_some(f64::INFINITY));
        }
        let mut back = Vec::new();
        let mut at = fleet.now;
        while let Some(ready) = fleet.held_back.next_ready() {
            at = at.max(ready);
            let copy = fleet.held_back.pop_ready(at).expect("one is ready then");
            back.push((copy, at - fleet.now));
        }
        back
    }

    #[test]
    fn a_pushed_back_record_is_held_half_to_all_of_its_ceiling_a_conflict_up_to_all() {
        // Third receive: a ceiling of 20 s (10 ms buckets: up to 10 ms later).
        let pressed = held(true, message(3, 0), 500);
        let conflicts = held(false, message(3, 0), 500);

        let within = |back: &[(Message, Micros)], from: Micros| {
            back.iter()
                .all(|(_, after)| (from..=20 * SECOND + 10_000).contains(after))
        };
        assert!(within(&pressed, 10 * SECOND), "{pressed:?}");
        assert!(within(&conflicts, 0), "{conflicts:?}");
        assert!(conflicts.iter().any(|(_, after)| *after < 10 * SECOND));
        assert!(
            pressed
                .iter()
                .all(|(m, _)| m.receives == 4 && m.copies == 0)
        );
    }

    #[test]
    fn a_final_receive_is_sent_again_as_a_copy_until_its_copies_or_their_time_are_spent() {
        let copy = held(true, message(MAX_ATTEMPTS, 3), 1);
        let last = held(false, message(MAX_ATTEMPTS, MAX_COPIES), 1);
        let pressed = held(true, message(MAX_ATTEMPTS, 2 * MAX_COPIES), 1);
        let hour_ago = Message {
            pressed_since: Some(2 * 3_600 * SECOND),
            ..message(MAX_ATTEMPTS, 2 * MAX_COPIES)
        };
        let since = Message {
            pressed_since: Some(3_600 * SECOND - 1),
            ..hour_ago
        };
        let recent = held(true, hour_ago, 1);
        let old = held(true, since, 1);

        // Its receives kept, one copy more; each copy doubles the ceiling (5 s x 2^(4 + 3)
        // = 640 s), as the worker's `pressed(receives + copies)` does.
        let (sent, after) = copy[0];
        assert_eq!((sent.receives, sent.copies), (MAX_ATTEMPTS, 4));
        assert!(
            (320 * SECOND..=640 * SECOND + 10_000).contains(&after),
            "{after}"
        );
        assert!(last.is_empty(), "dead-lettered: {last:?}");
        // AWS's push-back: copies for 2 h from the first, whatever their count.
        assert_eq!(pressed[0].0.pressed_since, Some(3 * 3_600 * SECOND));
        assert_eq!(recent[0].0.pressed_since, Some(2 * 3_600 * SECOND));
        assert!(old.is_empty(), "dead-lettered: {old:?}");
    }

    #[test]
    fn a_sandboxs_pressure_halves_once_a_second_and_grows_back_to_no_limit() {
        let mut sandbox = Sandbox {
            active: 10,
            ..Sandbox::default()
        };
        sandbox.cut(0);
        sandbox.cut(SECOND / 2);
        assert_eq!(sandbox.limit, Some(5.0), "one halving a second");
        assert!(!sandbox.has_room(0), "10 at work, 5 allowed");
        sandbox.cut(SECOND);
        assert_eq!(sandbox.limit, Some(2.5));
        sandbox.active = 1;
        assert!(sandbox.has_room(0));
        let grew: usize = (0..60).filter(|_| sandbox.grow()).count();
        assert_eq!(sandbox.limit, None, "back past the 10 it was cut from");
        assert!(grew >= 7, "{grew} steps of one record more");
    }
}
