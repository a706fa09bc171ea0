//! One host's run against a site model, simulated: the fleet's pace under its ceiling is the
//! worker's own arithmetic (`polite::limits::decide`'s schedule, `domain::health`'s learning,
//! the check at the start, and the starts given before a drop voided), the site a
//! model with a capacity (a knee: answer time grows with load, errors past it), a rate
//! limiter like nginx's `limit_req`, or a window of failures or silence. "Today" is the
//! fixed ceiling this replaced: a 429 or 503 doubles the slowdown, nothing else slows it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use conveyor_worker::domain::health::{self, Sign, Trouble};
use conveyor_worker::polite::limits::{HostState, MAX_SLOWDOWN, MIN_COOLDOWN_MS, Millis, interval};

/// How a site answers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SiteModel {
    /// `parallel` workers serving `capacity` pages a second in all (each page
    /// `parallel / capacity` s, ±10%); a request that finds `queue` waiting gets a 503.
    Knee {
        capacity: f64,
        parallel: u32,
        queue: u32,
    },
    /// nginx's `limit_req` at `rate` a second with `burst` (nodelay): its leaky bucket, a
    /// 429 to a request that would overflow it; pages in `page_ms`.
    Limiter {
        rate: f64,
        burst: f64,
        page_ms: Millis,
    },
    /// Pages in `page_ms`, but 500 to everything in `[from, from + lasting)`.
    Storm {
        from: Millis,
        lasting: Millis,
        page_ms: Millis,
    },
    /// Pages in `page_ms`, but no answer in `[from, from + lasting)`: a timeout after
    /// `timeout_ms`.
    Silent {
        from: Millis,
        lasting: Millis,
        timeout_ms: Millis,
        page_ms: Millis,
    },
}

/// Which rule paces the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// `domain::health`: every fetch's answer time, failures and push-backs.
    Adaptive,
    /// The fixed ceiling before it: 429 and 503 double the slowdown, with a cooldown.
    Today,
}

/// One simulated run.
#[derive(Debug, Clone, Copy)]
pub struct PaceRun {
    pub tasks: u64,
    /// The host's ceiling (requests a second) and in-flight limit.
    pub ceiling: f64,
    pub inflight: u32,
    pub site: SiteModel,
    pub rule: Rule,
    pub seed: u64,
}

/// What the run did to the site.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PaceOutcome {
    pub drained_s: f64,
    pub requests: u64,
    /// Answers that were errors (429, 5xx, timeouts), in all and from 20 s on.
    pub errors: u64,
    pub error_share: f64,
    pub error_share_after_20s: f64,
    /// Requests that reached the site inside a storm or silence window.
    pub in_window: u64,
    /// Trouble written to the host's item (a push-back's write), and the host item's writes
    /// in the busiest second (a take, a slot given back, trouble).
    pub trouble_writes: u64,
    pub most_writes_a_second: u64,
    /// The pace at the end of each 10 s, requests a second the schedule allowed.
    pub pace: Vec<f64>,
}

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Page,
    Status(u16),
    TimedOut,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A task's granted start (the task, when the start was given).
    Start(u64, Millis),
    /// A request's end (the task, its start).
    End(u64, Millis),
    /// A task back from its retry's backoff.
    Back(u64),
    /// A cooldown's end: the schedule is asked again.
    Wake,
}

struct Sim {
    run: PaceRun,
    state: HostState,
    rng: fastrand::Rng,
    events: BinaryHeap<Reverse<(Millis, Event)>>,
    pending: VecDeque<u64>,
    answers: Vec<Option<(Answer, Millis)>>,
    in_flight: u32,
    /// A start is granted and not yet taken (the schedule is asked one at a time).
    granted: bool,
    site: SiteState,
    writes: Vec<u64>,
    done: u64,
    /// Requests from 20 s on, and their errors.
    late: (u64, u64),
    out: PaceOutcome,
}

/// What the site model keeps: its workers' busy-until times and the queue's, the limiter's
/// bucket.
#[derive(Default)]
struct SiteState {
    workers: Vec<Millis>,
    waiting: Vec<Millis>,
    /// The limiter's excess and the last request it let through.
    bucket: Option<(f64, Millis)>,
}

/// Runs one simulated run.
pub fn simulate_pace(run: PaceRun) -> PaceOutcome {
    let mut sim = Sim {
        run,
        state: HostState::default(),
        rng: fastrand::Rng::with_seed(run.seed),
        events: BinaryHeap::new(),
        pending: (0..run.tasks).collect(),
        answers: vec![None; run.tasks as usize],
        in_flight: 0,
        granted: false,
        site: SiteState::default(),
        writes: Vec::new(),
        done: 0,
        late: (0, 0),
        out: PaceOutcome::default(),
    };
    sim.grant(0);
    while let Some(Reverse((now, event))) = sim.events.pop() {
        sim.handle(now, event);
        if sim.done == run.tasks {
            sim.out.drained_s = now as f64 / 1_000.0;
            break;
        }
    }
    sim.finish()
}

impl Sim {
    fn handle(&mut self, now: Millis, event: Event) {
        match event {
            Event::Start(task, given_at) => self.start(now, task, given_at),
            Event::End(task, start) => self.end(now, task, start),
            Event::Back(task) => {
                self.pending.push_back(task);
                self.grant(now);
            }
            Event::Wake => self.grant(now),
        }
        self.record_pace(now);
    }

    /// The schedule's next start for the head task, if a slot is free and none is granted.
    fn grant(&mut self, now: Millis) {
        if self.granted || self.in_flight >= self.run.inflight {
            return;
        }
        let Some(task) = self.pending.pop_front() else {
            return;
        };
        let pace = interval(Some(self.run.ceiling), self.state.slowdown_at(now)).unwrap_or(1);
        let start = self.state.next_start.map_or(now, |next| next.max(now));
        self.state.next_start = Some(start + pace);
        self.write(now);
        self.granted = true;
        self.events.push(Reverse((start, Event::Start(task, now))));
    }

    /// At the start: a cooldown recorded since holds the task; a start given before a
    /// slowdown keeps its turn in the slowdown's proportion; else the request goes.
    fn start(&mut self, now: Millis, task: u64, given_at: Millis) {
        self.granted = false;
        if let Some(until) = self.state.cooldown_until.filter(|u| *u > now) {
            self.pending.push_front(task);
            self.events.push(Reverse((until, Event::Wake)));
            return;
        }
        if self.run.rule == Rule::Adaptive && health::voided(&self.state, given_at) {
            self.pending.push_front(task);
            return self.grant(now);
        }
        // The check at the start and the network: it reaches the site a moment later.
        let at = now + self.rng.u64(0..START_JITTER_MS);
        let (answer, took) = self.request(at);
        self.answers[task as usize] = Some((answer, at - now + took));
        self.in_flight += 1;
        self.out.requests += 1;
        self.events
            .push(Reverse((at + took, Event::End(task, now))));
        self.grant(now);
    }

    /// A request's end: its sign learned, its trouble recorded, the slot given back; an
    /// error's task comes back after a backoff of a few seconds.
    fn end(&mut self, now: Millis, task: u64, start: Millis) {
        self.in_flight -= 1;
        let (answer, took) = self.answers[task as usize].expect("an answered request");
        let sign = match answer {
            Answer::Page => Sign::Answered(took),
            Answer::Status(429 | 503) => Sign::PushedBack(None),
            Answer::Status(_) | Answer::TimedOut => Sign::Failing,
        };
        let learned = match sign {
            Sign::Answered(ms) => Some(health::learn(&self.state, ms)),
            _ => None,
        };
        let trouble = match self.run.rule {
            Rule::Adaptive => health::trouble(
                &self.state,
                (sign, learned),
                (start, now),
                Some(self.run.ceiling),
            ),
            Rule::Today => today(&self.state, sign, now, self.run.ceiling),
        };
        if let Some(trouble) = trouble {
            self.record(now, trouble);
        }
        self.state.answers = learned.or(self.state.answers);
        self.write(now);
        if answer == Answer::Page {
            self.done += 1;
        } else {
            self.count_error(start);
            let backoff = self.rng.u64(1_000..5_000);
            self.events
                .push(Reverse((now + backoff, Event::Back(task))));
        }
        self.grant(now);
    }

    fn record(&mut self, now: Millis, trouble: Trouble) {
        let longer_stands = trouble
            .cooldown_until
            .is_some_and(|until| self.state.cooldown_until.is_some_and(|c| c >= until));
        if longer_stands {
            return;
        }
        self.state.cooldown_until = trouble.cooldown_until.or(self.state.cooldown_until);
        self.state.cooldown_ms = trouble.cooldown_ms.or(self.state.cooldown_ms);
        if let Some(slowdown) = trouble.slowdown {
            self.state.slowdown = Some((slowdown, now));
            self.state.knee = trouble.knee;
            self.state.next_start = trouble.next_start.or(self.state.next_start);
        }
        self.out.trouble_writes += 1;
        self.write(now);
    }

    fn count_error(&mut self, start: Millis) {
        self.out.errors += 1;
        if start >= LATE_MS {
            self.late.1 += 1;
        }
    }

    /// One request reaches the site at `now`: its answer and how long it took.
    fn request(&mut self, now: Millis) -> (Answer, Millis) {
        if start_in_window(self.run.site, now) {
            self.out.in_window += 1;
        }
        if now >= LATE_MS {
            self.late.0 += 1;
        }
        match self.run.site {
            SiteModel::Knee {
                capacity,
                parallel,
                queue,
            } => self.knee(now, (capacity, parallel, queue)),
            SiteModel::Limiter {
                rate,
                burst,
                page_ms,
            } => {
                // The request's arrival moves by a few milliseconds on the network.
                let at = now + self.rng.u64(0..5);
                // nginx's bucket: the excess left by the last request let through, drained
                // at the rate since, plus this one.
                let (excess, last) = self.site.bucket.unwrap_or((0.0, at));
                let elapsed = at.saturating_sub(last) as f64 / 1_000.0;
                let excess = (excess - rate * elapsed).max(0.0) + 1.0;
                if excess > burst + 1.0 {
                    return (Answer::Status(429), 1);
                }
                self.site.bucket = Some((excess, at));
                (Answer::Page, page_ms)
            }
            SiteModel::Storm { .. } if start_in_window(self.run.site, now) => {
                (Answer::Status(500), 5)
            }
            SiteModel::Silent { timeout_ms, .. } if start_in_window(self.run.site, now) => {
                (Answer::TimedOut, timeout_ms)
            }
            SiteModel::Storm { page_ms, .. } | SiteModel::Silent { page_ms, .. } => {
                (Answer::Page, page_ms)
            }
        }
    }

    /// A site of `parallel` workers: the request is served by the first free one, after
    /// the requests waiting before it; one that finds `queue` waiting gets a 503 at once.
    fn knee(
        &mut self,
        now: Millis,
        (capacity, parallel, queue): (f64, u32, u32),
    ) -> (Answer, Millis) {
        let site = &mut self.site;
        if site.workers.is_empty() {
            site.workers = vec![0; parallel as usize];
        }
        site.waiting.retain(|served_from| *served_from > now);
        if site.waiting.len() >= queue as usize {
            return (Answer::Status(503), 2);
        }
        let page = parallel as f64 * 1_000.0 / capacity;
        let page = (page * self.rng.f64().mul_add(0.2, 0.9)) as Millis;
        let (worker, free_at) = site
            .workers
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|(_, free_at)| *free_at)
            .expect("a site has a worker");
        let served_from = free_at.max(now);
        if served_from > now {
            site.waiting.push(served_from);
        }
        site.workers[worker] = served_from + page;
        (Answer::Page, served_from + page - now)
    }

    fn write(&mut self, now: Millis) {
        let second = (now / 1_000) as usize;
        if self.writes.len() <= second {
            self.writes.resize(second + 1, 0);
        }
        self.writes[second] += 1;
    }

    fn record_pace(&mut self, now: Millis) {
        let tenth = (now / 10_000) as usize;
        while self.out.pace.len() <= tenth {
            let pace = self.run.ceiling / self.state.slowdown_at(now);
            self.out.pace.push((pace * 100.0).round() / 100.0);
        }
    }

    fn finish(mut self) -> PaceOutcome {
        self.out.error_share = self.out.errors as f64 / self.out.requests.max(1) as f64;
        self.out.error_share_after_20s = self.late.1 as f64 / self.late.0.max(1) as f64;
        self.out.most_writes_a_second = self.writes.iter().copied().max().unwrap_or(0);
        self.out
    }
}

/// A request reaches the site up to this long after its start: the check of the host's
/// item there (a loaded table's answer time) and the network.
const START_JITTER_MS: Millis = 60;

/// Errors are counted apart from this time on (the fleet has learned the site by then).
const LATE_MS: Millis = 20_000;

/// Whether a request at `now` falls in the site's storm or silence.
fn start_in_window(site: SiteModel, now: Millis) -> bool {
    match site {
        SiteModel::Storm { from, lasting, .. } | SiteModel::Silent { from, lasting, .. } => {
            (from..from + lasting).contains(&now)
        }
        _ => false,
    }
}

/// The rule before adaptive politeness: a 429 or 503 doubles the slowdown in force, with a
/// cooldown of one slowed interval (at least a second); nothing else slows the host.
fn today(state: &HostState, sign: Sign, now: Millis, ceiling: f64) -> Option<Trouble> {
    let Sign::PushedBack(retry_after) = sign else {
        return None;
    };
    let slowdown = (state.slowdown_at(now) * 2.0).min(MAX_SLOWDOWN);
    let slowed = interval(Some(ceiling), slowdown).unwrap_or(MIN_COOLDOWN_MS);
    Some(Trouble {
        cooldown_until: Some(now + retry_after.unwrap_or(slowed.max(MIN_COOLDOWN_MS))),
        slowdown: Some(slowdown),
        knee: None,
        next_start: None,
        cooldown_ms: None,
        failing_until: None,
    })
}

/// The five sites and a day-long run against a site with a knee, each under both
/// rules: `(name, run)`.
pub fn scenarios() -> Vec<(&'static str, PaceRun)> {
    let run = |tasks, ceiling, inflight, site| PaceRun {
        tasks,
        ceiling,
        inflight,
        site,
        rule: Rule::Adaptive,
        seed: 7,
    };
    let page_ms = 50;
    vec![
        (
            "nginx limit_req 2/s (burst 5), ceiling 10/s",
            run(
                400,
                10.0,
                2,
                SiteModel::Limiter {
                    rate: 2.0,
                    burst: 5.0,
                    page_ms: 2,
                },
            ),
        ),
        (
            "one request at a time (200 ms), ceiling 20/s, 10 in flight",
            run(
                400,
                20.0,
                10,
                SiteModel::Knee {
                    capacity: 5.0,
                    parallel: 1,
                    queue: 2,
                },
            ),
        ),
        (
            "500 to everything for 15 s, ceiling 10/s",
            run(
                400,
                10.0,
                2,
                SiteModel::Storm {
                    from: 10_000,
                    lasting: 15_000,
                    page_ms,
                },
            ),
        ),
        (
            "no answer for 20 s (3 s timeouts), ceiling 10/s",
            run(
                400,
                10.0,
                2,
                SiteModel::Silent {
                    from: 10_000,
                    lasting: 20_000,
                    timeout_ms: 3_000,
                    page_ms,
                },
            ),
        ),
        (
            "healthy 20 ms, ceiling 10/s",
            run(
                400,
                10.0,
                2,
                SiteModel::Storm {
                    from: Millis::MAX / 2,
                    lasting: 1,
                    page_ms: 20,
                },
            ),
        ),
        (
            "100,000 tasks, a knee at 4/s (2 workers, 500 ms), ceiling 10/s, 8 in flight",
            run(
                100_000,
                10.0,
                8,
                SiteModel::Knee {
                    capacity: 4.0,
                    parallel: 2,
                    queue: 4,
                },
            ),
        ),
    ]
}

/// The scenarios under both rules, as a markdown table.
pub fn markdown() -> String {
    let mut table = String::from(
        "| site | rule | drained (s) | pages/s | requests | errors | errors from 20 s | in the storm or silence | trouble writes | most host writes a second |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, run) in scenarios() {
        for rule in [Rule::Adaptive, Rule::Today] {
            let out = simulate_pace(PaceRun { rule, ..run });
            table.push_str(&format!(
                "| {name} | {} | {:.0} | {:.2} | {} | {:.1}% | {:.1}% | {} | {} | {} |\n",
                if rule == Rule::Adaptive {
                    "adaptive"
                } else {
                    "fixed ceiling (before)"
                },
                out.drained_s,
                run.tasks as f64 / out.drained_s,
                out.requests,
                out.error_share * 100.0,
                out.error_share_after_20s * 100.0,
                out.in_window,
                out.trouble_writes,
                out.most_writes_a_second,
            ));
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(name: &str, rule: Rule) -> PaceOutcome {
        let (_, run) = scenarios()
            .into_iter()
            .find(|(n, _)| n.starts_with(name))
            .expect("a scenario");
        simulate_pace(PaceRun { rule, ..run })
    }

    #[test]
    fn a_rate_limited_site_is_learned_within_its_limit_at_most_of_its_rate() {
        let out = outcome("nginx", Rule::Adaptive);

        assert!(out.error_share_after_20s <= 0.05, "{out:?}");
        assert!(400.0 / out.drained_s >= 0.8 * 2.0, "{out:?}");
    }

    #[test]
    fn a_storm_of_500s_is_asked_a_few_times_where_the_fixed_ceiling_asked_all_the_time() {
        let adaptive = outcome("500", Rule::Adaptive);
        let today = outcome("500", Rule::Today);

        assert!(adaptive.in_window <= 45, "{adaptive:?}");
        assert!(today.in_window > 100, "{today:?}");
    }

    #[test]
    fn a_healthy_site_runs_at_its_ceiling() {
        let out = outcome("healthy", Rule::Adaptive);

        assert_eq!(out.errors, 0);
        assert!(400.0 / out.drained_s >= 9.5, "{out:?}");
    }

    #[test]
    fn a_day_long_run_converges_under_the_knee_with_few_errors_and_a_cool_host_item() {
        let out = outcome("100,000", Rule::Adaptive);
        println!("{}", markdown());

        assert!(out.error_share_after_20s <= 0.05, "{out:?}");
        assert!(100_000.0 / out.drained_s >= 0.8 * 4.0, "{out:?}");
        assert!(out.most_writes_a_second <= 30, "{out:?}");
    }
}
