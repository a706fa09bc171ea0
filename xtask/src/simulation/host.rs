//! One host's run through the fleet's politeness, simulated: the schedule's arithmetic is
//! the worker's own (`polite::limits::decide`), the parking rules its own (a copy due at
//! most 15 minutes ahead, a longer wait held through the visibility timeout on a copy's
//! first receive), and the queue an intake that reads messages at a bounded rate, in the
//! order they become visible, so copies due while the backlog is read wait behind it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use conveyor_worker::polite::limits::{Ask, Grant, HostState, Millis, decide, interval};

/// One simulated one-host run.
#[derive(Debug, Clone, Copy)]
pub struct HostRun {
    pub tasks: u64,
    /// The host's rate (requests a second) and in-flight limit.
    pub rate: f64,
    pub inflight: u32,
    /// How long a fetch takes.
    pub fetch_ms: Millis,
    /// Messages the fleet receives a second at most (its pollers' pace).
    pub read_rate: f64,
}

/// What the run cost the host's item and the queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostOutcome {
    /// When the last task was fetched, and the host's own N / rate.
    pub drained_s: f64,
    pub ideal_s: f64,
    /// When the fleet had first read every producer's message.
    pub backlog_read_s: f64,
    pub copies_per_task: f64,
    pub holds_per_task: f64,
    pub receives_per_task: f64,
    /// AWS requests a task: the guard's reads of fresh deliveries, the host's item's writes,
    /// the claim, the page and the terminal write, the copies and the holds (the parents'
    /// read, kept 5 s per sandbox, left out).
    pub requests_per_task: f64,
    /// Writes of the host's item per task, and the most in any second: while the backlog
    /// is read and the minute after (every task books once; the copies that came due
    /// meanwhile, received behind the backlog, book again), and after (while tasks wait).
    pub writes_per_task: f64,
    pub most_writes_a_second_reading: u64,
    pub most_writes_a_second_waiting: u64,
    /// Bookings missed (copies received later than their start) and booked again.
    pub missed: u64,
}

/// The worker's constants, as in `polite` and `worker`.
const SLEEP_MAX_MS: Millis = 1_000;
const BOOKING_LEAD_MS: Millis = 1_500;
const READ_LEAD_MS: Millis = 250;
const SQS_MAX_DELAY_MS: Millis = 900_000;
const MAX_HOLD_MS: Millis = 11 * 3_600_000;
const MAX_WAIT_MS: Millis = 48 * 3_600_000;
/// Starts booked in one write at most, by records received within this long of each other.
const BOOKED_TOGETHER: usize = 10;
const TOGETHER_MS: Millis = 100;

/// A message as the intake receives it: its task, the start it carries, and how many times
/// this message was received before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Message {
    task: u64,
    booked: Option<Millis>,
    received_before: u32,
}

struct Sim {
    run: HostRun,
    state: HostState,
    interval: Millis,
    /// Messages by the time they become visible.
    visible: BinaryHeap<Reverse<(Millis, Message)>>,
    read_gap: f64,
    intake_read: f64,
    /// When each slot's fetch ends.
    fetching: Vec<Millis>,
    writes: Vec<u64>,
    /// The last booking write and how many starts it booked: records of one host received
    /// together (a batch of ten) book together, in one write.
    last_booking: (Millis, usize),
    out: HostOutcome,
    done: u64,
}

/// Runs one simulated one-host run.
pub fn simulate_host(run: HostRun) -> HostOutcome {
    let interval = interval(Some(run.rate), 1.0).unwrap_or(1);
    let mut sim = Sim {
        run,
        state: HostState::default(),
        interval,
        visible: BinaryHeap::new(),
        read_gap: 1_000.0 / run.read_rate,
        intake_read: 0.0,
        fetching: vec![0; run.inflight as usize],
        writes: Vec::new(),
        last_booking: (0, BOOKED_TOGETHER),
        out: HostOutcome::default(),
        done: 0,
    };
    for task in 0..run.tasks {
        sim.visible.push(Reverse((
            0,
            Message {
                task,
                booked: None,
                received_before: 0,
            },
        )));
    }
    sim.drain();
    sim.finish()
}

impl Sim {
    fn drain(&mut self) {
        while let Some(Reverse((visible_at, message))) = self.visible.pop() {
            // The intake reads one message at a time, at its pace, in visibility order.
            self.intake_read = self.intake_read.max(visible_at as f64) + self.read_gap;
            let now = self.intake_read as Millis;
            if message.booked.is_none() && message.received_before == 0 {
                self.out.backlog_read_s = self.out.backlog_read_s.max(now as f64 / 1e3);
            }
            self.out.receives_per_task += 1.0;
            self.receive(now, message);
        }
    }

    fn receive(&mut self, now: Millis, message: Message) {
        let Some(start) = message.booked else {
            return self.take(now, message);
        };
        if start > now + BOOKING_LEAD_MS + SLEEP_MAX_MS {
            // Come early: parked again, at no write.
            return self.park(now, message, start);
        }
        if now > start + self.interval {
            self.out.missed += 1;
            let fresh = Message {
                booked: None,
                ..message
            };
            return self.take(now, fresh);
        }
        self.fetch_at(start, message);
    }

    /// A record without a booking (after the guard's read): its start now (within the
    /// sleep), or booked.
    fn take(&mut self, now: Millis, message: Message) {
        self.out.requests_per_task += 1.0;
        let interval = self.interval;
        let ask = |horizon| Ask {
            now,
            interval: Some(interval),
            horizon,
            slot: None,
            slots: 0,
        };
        let grant = match decide(&self.state, &ask(now + SLEEP_MAX_MS)) {
            (Grant::Later(_), _) => {
                self.book_write(now);
                decide(&self.state, &ask(now + MAX_WAIT_MS))
            }
            near => {
                self.write(now);
                near
            }
        };
        let (Grant::StartAt(start), after) = grant else {
            unreachable!("the schedule books any start within two days")
        };
        self.state = after;
        if start <= now + SLEEP_MAX_MS {
            return self.fetch_at(start, message);
        }
        self.park(now, message, start);
    }

    /// Back at its turn: a fresh copy due then (at most 15 minutes ahead), or, on the first
    /// receive of a copy that carries the booking, held through its visibility (at most 11
    /// hours).
    fn park(&mut self, now: Millis, message: Message, start: Millis) {
        let due = start.saturating_sub(BOOKING_LEAD_MS).max(now);
        let wait = due - now;
        let carries = message.booked == Some(start) && message.received_before == 0;
        let next = if wait > SQS_MAX_DELAY_MS && carries {
            self.out.holds_per_task += 1.0;
            let held = Message {
                received_before: message.received_before + 1,
                ..message
            };
            (now + wait.min(MAX_HOLD_MS), held)
        } else {
            self.out.copies_per_task += 1.0;
            let copy = Message {
                received_before: 0,
                booked: Some(start),
                ..message
            };
            (now + wait.min(SQS_MAX_DELAY_MS), copy)
        };
        self.visible.push(Reverse(next));
    }

    /// The fetch at its start: a slot taken just before (one write) and given back after
    /// (one write); a slot still taken books the record again.
    fn fetch_at(&mut self, start: Millis, message: Message) {
        self.write(start.saturating_sub(READ_LEAD_MS));
        let Some(slot) = self.fetching.iter().position(|&ends| ends <= start) else {
            let fresh = Message {
                booked: None,
                ..message
            };
            return self.take(start, fresh);
        };
        let ends = start + self.run.fetch_ms;
        self.fetching[slot] = ends;
        self.write(ends);
        self.done += 1;
        self.out.drained_s = self.out.drained_s.max(ends as f64 / 1e3);
    }

    /// A booking: a write of its own, or a start its batch's first booking took with its own.
    fn book_write(&mut self, at: Millis) {
        let (last, booked) = self.last_booking;
        if at <= last + TOGETHER_MS && booked < BOOKED_TOGETHER {
            self.last_booking.1 += 1;
            return;
        }
        self.last_booking = (at, 1);
        self.write(at);
    }

    fn write(&mut self, at: Millis) {
        let second = (at / 1_000) as usize;
        if self.writes.len() <= second {
            self.writes.resize(second + 1, 0);
        }
        self.writes[second] += 1;
    }

    fn finish(mut self) -> HostOutcome {
        let tasks = self.run.tasks as f64;
        let read = self.out.backlog_read_s.ceil() as usize + 60;
        let (reading, waiting) = self.writes.split_at(read.min(self.writes.len()));
        self.out.most_writes_a_second_reading = reading.iter().copied().max().unwrap_or(0);
        self.out.most_writes_a_second_waiting = waiting.iter().copied().max().unwrap_or(0);
        self.out.writes_per_task = self.writes.iter().sum::<u64>() as f64 / tasks;
        let parked = self.out.copies_per_task + self.out.holds_per_task;
        // The claim, the page and the terminal write of each task's one fetch.
        let fetched = 3.0 * tasks;
        self.out.requests_per_task =
            (self.out.requests_per_task + parked + fetched) / tasks + self.out.writes_per_task;
        self.out.copies_per_task /= tasks;
        self.out.holds_per_task /= tasks;
        self.out.receives_per_task /= tasks;
        self.out.ideal_s = tasks / self.run.rate;
        assert_eq!(self.done, self.run.tasks, "every task fetched once");
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A day-long run of one host at its default rate, read by a fleet that receives 500
    /// messages a second.
    const DAY: HostRun = HostRun {
        tasks: 100_000,
        rate: 1.0,
        inflight: 2,
        fetch_ms: 200,
        read_rate: 500.0,
    };

    #[test]
    fn a_day_long_one_host_run_drains_at_its_rate_and_waiting_keeps_the_host_item_cool() {
        let out = simulate_host(DAY);
        println!("one host, 100,000 tasks at 1/s: {out:?}");

        assert!(
            out.drained_s <= out.ideal_s * 1.01 + out.backlog_read_s,
            "{out:?}"
        );
        assert!(out.copies_per_task <= 2.0, "{out:?}");
        assert!(out.holds_per_task <= 2.0, "{out:?}");
        // While tasks wait, the host's item is written for the fetches it lets through (a
        // slot taken and given back) and the bookings missed: near its rate, not per task.
        assert!(out.most_writes_a_second_waiting <= 4, "{out:?}");
        assert!(out.writes_per_task <= 2.2, "{out:?}");
        assert!(out.requests_per_task <= 10.0, "{out:?}");
        // While the backlog is read, every ten tasks book in one write.
        assert!(out.most_writes_a_second_reading <= 60, "{out:?}");
    }

    #[test]
    fn a_run_of_minutes_needs_no_hold_and_one_copy_a_task() {
        let out = simulate_host(HostRun {
            tasks: 300,
            rate: 5.0,
            ..DAY
        });

        assert_eq!(out.holds_per_task, 0.0);
        assert!(out.copies_per_task <= 1.0, "{out:?}");
        assert!(
            out.drained_s <= out.ideal_s * 1.1 + out.backlog_read_s,
            "{out:?}"
        );
    }
}
