//! A host's health, as the fleet learns it from its fetches. This is pure arithmetic.
//!
//! It tracks how fast the site answers: an average, and a floor for when the site is not
//! loaded. It also decides what a push-back, a failure or a slow answer does to the host's
//! cooldown and to the fleet's pace (its request rate) under the host's ceiling. The pace is
//! lowered by a slowdown factor. The slowdown is raised at most once per round of fetches and
//! wears off by half-lives. docs/fetching.md explains the numbers.

use crate::domain::limits::{
    HostState, MAX_RETRY_AFTER_MS, MAX_SLOWDOWN, MIN_COOLDOWN_MS, Millis, interval,
};

/// What one fetch says of its host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sign {
    /// An answer that means no trouble, whatever its status, after this long.
    Answered(Millis),
    /// 429 or 503: the site asks for less, perhaps with `Retry-After`.
    PushedBack(Option<Millis>),
    /// Another 5xx, a timeout, a reset or no connection: the site is failing.
    Failing,
}

/// The average answer time gives each new answer this weight.
const ANSWER_WEIGHT: f64 = 0.2;
/// On each answer, the floor rises toward a slower average by this share of the gap. It
/// drops to a faster average at once. So it tracks the site's answer time when not loaded.
const FLOOR_RISE: f64 = 0.02;
/// An average this many times its floor, and this much over it, is slow. It means the site
/// queues our requests: we are at a knee of its capacity.
const SLOW_FACTOR: f64 = 2.0;
const SLOW_MARGIN_MS: f64 = 100.0;
/// A push-back is the site's own word that we ask too much. It multiplies the slowdown by
/// this, so the pace goes to two thirds, near CUBIC's 70%. The first push-back, with no knee
/// yet, halves the pace, as TCP does when slow start ends. So a fleet at many times a site's
/// capacity gets under it in fewer rounds, and each of those rounds meets a full queue. A
/// failure, or answers growing slow, may not be caused by our load. They take the gentler
/// decrease (80%). A failing site's cooldown does the rest.
pub const DECREASE: f64 = 1.5;
pub const FIRST_DECREASE: f64 = 2.0;
pub const SLOW_DECREASE: f64 = 1.25;
/// A push-back drops the pace by how much slower answers have grown, up to this.
const MOST_QUEUED_DECREASE: f64 = 4.0;
/// A push-back or slow answers set the knee this much slower than the pace they hit at. The
/// fleet comes back fast to 90% of that pace, then probes past it slowly.
const KNEE_MARGIN: f64 = 1.1;
/// A drop of the pace covers the trouble of fetches that start within a round of it. A
/// round is the site's average answer time, since a queue built before the drop takes that
/// long to drain. A round is at most this long.
const MOST_ROUND_MS: Millis = 2_000;
/// A failing host's cooldown lasts this long at first. It doubles while each failure comes
/// within twice its length of the last, up to `MOST_COOLDOWN_MS`.
const FIRST_COOLDOWN_MS: Millis = MIN_COOLDOWN_MS;
const MOST_COOLDOWN_MS: Millis = 30_000;
/// A failure keeps a site to one fetch at a time until an answer, or until this long after
/// its cooldown ends if none comes (no fetch went, or its answer was not recorded). It
/// outlasts the longest cooldown and a probe's timeout, so each probe's failure extends it
/// before it lapses.
const BREAKER_OPEN_MS: Millis = 2 * MOST_COOLDOWN_MS;

/// The host's answer times after one more answer: `(average, floor)`, in milliseconds.
pub fn learn(state: &HostState, answer_ms: Millis) -> (f64, f64) {
    let sample = answer_ms as f64;
    let Some((mean, floor)) = state.answers else {
        return (sample, sample);
    };
    let mean = mean + ANSWER_WEIGHT * (sample - mean);
    let floor = if mean < floor {
        mean
    } else {
        floor + FLOOR_RISE * (mean - floor)
    };
    (mean, floor)
}

/// Whether answer times this slow say the site is queueing our requests.
pub fn is_slow((mean, floor): (f64, f64)) -> bool {
    mean > floor * SLOW_FACTOR && mean > floor + SLOW_MARGIN_MS
}

/// What the host's item records about a fetch's trouble. `cooldown_until`: the cooldown, or
/// none when only the pace drops. `slowdown`: the slowdown from now, or none when the pace
/// stays. `next_start`: the schedule, restarted from now. `cooldown_ms`: the failing
/// cooldown's length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trouble {
    pub cooldown_until: Option<Millis>,
    pub slowdown: Option<f64>,
    /// The knee: the slowdown wears off fast down to it. None for a failing site, whose
    /// slowdown wears off at one speed.
    pub knee: Option<f64>,
    pub next_start: Option<Millis>,
    pub cooldown_ms: Option<Millis>,
    /// A failing site's breaker is open until then: one fetch at a time goes to it, as a
    /// circuit breaker's half-open probe, until an answer closes it. Set by a failure to a
    /// minute past its cooldown's end ([`BREAKER_OPEN_MS`]).
    pub failing_until: Option<Millis>,
}

/// The trouble to record after a fetch that started at `started` gave `sign` at `now`.
/// `answers` holds the item's answer times, this fetch's included. `None` means nothing to
/// record.
///
/// A fetch that started before the last drop of the pace was recorded, or within a round
/// after it, met the load that drop was for. So its trouble was already counted, and it
/// drops the pace no further. A burst of answers to one round of fetches drops the pace
/// once, as TCP halves its window once per round trip. The fetch's `Retry-After` is still
/// obeyed.
pub fn trouble(
    state: &HostState,
    (sign, answers): (Sign, Option<(f64, f64)>),
    (started, now): (Millis, Millis),
    max_rps: Option<f64>,
) -> Option<Trouble> {
    let counted = counted_since(state, started);
    let drop = drop_for(state, sign, now, max_rps);
    let slowed = drop.slowdown.unwrap_or(1.0);
    match sign {
        Sign::Answered(_) if counted || !answers.is_some_and(is_slow) => None,
        Sign::Answered(_) => Some(drop),
        Sign::PushedBack(Some(retry_after)) => Some(Trouble {
            cooldown_until: Some(now.saturating_add(retry_after.min(MAX_RETRY_AFTER_MS))),
            ..if counted {
                Trouble {
                    slowdown: None,
                    next_start: None,
                    ..drop
                }
            } else {
                drop
            }
        }),
        Sign::PushedBack(None) | Sign::Failing if counted => None,
        // The drop and the schedule's restart put the next start one slowed interval away,
        // or further if the site's queue adds a longer wait to its answers. So what the site
        // has queued drains before the next start reaches it. A pace just under its capacity
        // drains a queue slowly, and each request that meets a full queue is refused and
        // drops the pace again.
        Sign::PushedBack(None) => Some(Trouble {
            cooldown_until: Some(now.saturating_add(
                interval(max_rps.or(Some(1.0)), slowed).map_or(1, |i| i.max(queue_wait(state))),
            )),
            ..drop
        }),
        Sign::Failing => {
            let length = failing_cooldown(state, now).max(slowed_interval(max_rps, slowed));
            let until = now.saturating_add(length);
            Some(Trouble {
                cooldown_until: Some(until),
                cooldown_ms: Some(length),
                knee: None,
                failing_until: Some(until.saturating_add(BREAKER_OPEN_MS)),
                ..drop
            })
        }
    }
}

/// Whether a drop of the pace recorded after `started`, or within a round of answers
/// before it, already counted the trouble of a fetch that started then.
fn counted_since(state: &HostState, started: Millis) -> bool {
    let round = state
        .answers
        .map_or(0, |(mean, _)| (mean as Millis).min(MOST_ROUND_MS));
    state
        .slowdown
        .is_some_and(|(_, at)| at.saturating_add(round) >= started)
}

/// The drop of the pace that `sign` asks for at `now`. The schedule restarts one slowed
/// interval after it, because a fetch may have started just before and the ceiling holds
/// across the drop. Trouble strikes at the site's limit or above it. So each time, the knee
/// is set under that pace, like CUBIC's W_max. A fleet far above the limit meets trouble
/// again a round after each drop, long before it is back at the knee. So its drops compound.
fn drop_for(state: &HostState, sign: Sign, now: Millis, max_rps: Option<f64>) -> Trouble {
    let in_force = state.slowdown_at(now);
    let factor = match sign {
        Sign::PushedBack(_) if state.knee.is_some() => DECREASE.max(queued(state)),
        Sign::PushedBack(_) => FIRST_DECREASE.max(queued(state)),
        Sign::Answered(_) | Sign::Failing => SLOW_DECREASE,
    };
    let slowdown = (in_force * factor).min(MAX_SLOWDOWN);
    Trouble {
        cooldown_until: None,
        slowdown: Some(slowdown),
        knee: Some(in_force * KNEE_MARGIN),
        next_start: Some(now.saturating_add(interval(max_rps, slowdown).unwrap_or(0))),
        cooldown_ms: state.cooldown_ms,
        failing_until: None,
    }
}

/// The host's average answer time as a multiple of its floor, at most
/// [`MOST_QUEUED_DECREASE`]. A site that queues our requests answers that much slower. So a
/// push-back then drops the pace at least that much. The queue tells how far over the site's
/// capacity the fleet is, where a fixed drop would take several rounds. Answers less than
/// [`SLOW_MARGIN_MS`] over the floor count as unloaded, since a fast site's jitter is no
/// queue.
fn queued(state: &HostState) -> f64 {
    match state.answers {
        Some((mean, floor)) if mean > floor + SLOW_MARGIN_MS => {
            (mean / floor.max(1.0)).clamp(1.0, MOST_QUEUED_DECREASE)
        }
        _ => 1.0,
    }
}

/// How much longer than its floor the host's average answer takes, in ms, at most a round.
/// This is the wait a request meets in the site's queue. So it is about how long that queue
/// takes to drain once no more requests join it.
fn queue_wait(state: &HostState) -> Millis {
    state.answers.map_or(0, |(mean, floor)| {
        ((mean - floor).max(0.0) as Millis).min(MOST_ROUND_MS)
    })
}

/// Whether a start given at `given_at` was given before the last drop of the pace. Such a
/// start was spaced at the old pace, so it is void and the schedule is asked again. The
/// drop restarted the schedule from its own time, at the new pace.
pub fn voided(state: &HostState, given_at: Millis) -> bool {
    state.slowdown.is_some_and(|(_, at)| at > given_at)
}

/// One interval at the slowed pace, at least [`MIN_COOLDOWN_MS`]: a failing site's
/// shortest cooldown.
fn slowed_interval(max_rps: Option<f64>, slowdown: f64) -> Millis {
    interval(max_rps.or(Some(1.0)), slowdown).map_or(MIN_COOLDOWN_MS, |i| i.max(MIN_COOLDOWN_MS))
}

/// A failing host's cooldown: the first one, or twice the last while failures follow it
/// closely. So a site that is down for a while is asked less and less often, as with a
/// circuit breaker.
fn failing_cooldown(state: &HostState, now: Millis) -> Millis {
    match (state.cooldown_until, state.cooldown_ms) {
        (Some(until), Some(last)) if now <= until.saturating_add(2 * last) => {
            (last * 2).min(MOST_COOLDOWN_MS)
        }
        _ => FIRST_COOLDOWN_MS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slowed(factor: f64, at: Millis) -> HostState {
        HostState {
            slowdown: Some((factor, at)),
            ..HostState::default()
        }
    }

    #[test]
    fn answer_times_average_and_their_floor_follows_the_fastest_average() {
        let mut state = HostState::default();
        for ms in [100, 100, 100, 100] {
            state.answers = Some(learn(&state, ms));
        }
        let (mean, floor) = learn(&state, 600);

        assert_eq!(state.answers, Some((100.0, 100.0)));
        assert!((mean - 200.0).abs() < 1e-9);
        assert!(
            (floor - 102.0).abs() < 1e-9,
            "the floor rises slowly: {floor}"
        );
        assert!(!is_slow((mean, floor)));
        assert!(is_slow((450.0, 100.0)));
        assert!(!is_slow((12.0, 5.0)), "a fast site's noise is not slow");
    }

    #[test]
    fn a_failure_slows_the_pace_once_a_round_and_cools_the_host_for_longer_each_time() {
        let now = 100_000;
        let first = trouble(
            &HostState::default(),
            (Sign::Failing, None),
            (now - 50, now),
            Some(10.0),
        );
        let first = first.expect("a failure is trouble");
        let after = HostState {
            cooldown_until: first.cooldown_until,
            slowdown: first.slowdown.map(|s| (s, now)),
            cooldown_ms: first.cooldown_ms,
            ..HostState::default()
        };

        let same_round = trouble(
            &after,
            (Sign::Failing, None),
            (now - 20, now + 10),
            Some(10.0),
        );
        let next = trouble(
            &after,
            (Sign::Failing, None),
            (now + 1_000, now + 1_100),
            Some(10.0),
        );

        assert_eq!(first.slowdown, Some(SLOW_DECREASE));
        assert_eq!(first.cooldown_until, Some(now + 1_000));
        assert_eq!(
            same_round, None,
            "it was in flight when the first was counted"
        );
        let next = next.expect("a later round's failure is trouble");
        assert_eq!(next.cooldown_ms, Some(2_000));
        assert_eq!(next.cooldown_until, Some(now + 1_100 + 2_000));
        let slowdown = next.slowdown.expect("a drop");
        assert!(
            (slowdown - SLOW_DECREASE * SLOW_DECREASE).abs() < 0.05,
            "worn off a little"
        );
    }

    #[test]
    fn a_cooldown_starts_short_again_once_trouble_has_stopped_for_a_while() {
        let state = HostState {
            cooldown_until: Some(10_000),
            cooldown_ms: Some(8_000),
            ..HostState::default()
        };

        assert_eq!(failing_cooldown(&state, 20_000), 16_000);
        assert_eq!(failing_cooldown(&state, 26_001), FIRST_COOLDOWN_MS);
        let long = HostState {
            cooldown_ms: Some(MOST_COOLDOWN_MS),
            ..state
        };
        assert_eq!(failing_cooldown(&long, 20_000), MOST_COOLDOWN_MS);
    }

    #[test]
    fn retry_after_is_obeyed_even_from_a_fetch_already_counted() {
        let state = slowed(2.0, 5_000);

        let told = trouble(
            &state,
            (Sign::PushedBack(Some(3_000)), None),
            (4_000, 5_100),
            Some(5.0),
        );

        let told = told.expect("Retry-After is recorded");
        assert_eq!(told.cooldown_until, Some(8_100));
        assert_eq!(told.slowdown, None, "not slowed twice");
    }

    #[test]
    fn a_slow_average_slows_the_pace_without_a_cooldown_and_a_fast_one_does_nothing() {
        let state = HostState::default();

        let slow = trouble(
            &state,
            (Sign::Answered(900), Some((500.0, 100.0))),
            (0, 1_000),
            Some(5.0),
        );
        let fast = trouble(
            &state,
            (Sign::Answered(90), Some((100.0, 100.0))),
            (0, 1_000),
            Some(5.0),
        );

        assert_eq!(
            slow,
            Some(Trouble {
                cooldown_until: None,
                slowdown: Some(SLOW_DECREASE),
                knee: Some(KNEE_MARGIN),
                next_start: Some(1_000 + 250),
                cooldown_ms: None,
                failing_until: None,
            })
        );
        assert_eq!(fast, None);
    }

    #[test]
    fn trouble_from_a_fetch_that_met_the_queue_of_before_the_drop_drops_nothing_more() {
        // Arrange: dropped at 10 s; the site answers in 500 ms on average.
        let state = HostState {
            answers: Some((500.0, 200.0)),
            ..slowed(DECREASE, 10_000)
        };
        let pushed_back = |started: Millis| {
            trouble(
                &state,
                (Sign::PushedBack(None), None),
                (started, started + 10),
                Some(20.0),
            )
        };

        // Act
        let within_the_round = pushed_back(10_400);
        let after_it = pushed_back(10_600);

        // Assert: the second drop compounds, with its knee under the pace it struck at.
        assert_eq!(within_the_round, None);
        let after_it = after_it.expect("a later round's push-back drops the pace");
        let in_force = state.slowdown_at(10_610);
        assert_eq!(
            after_it.slowdown,
            Some(in_force * 2.5),
            "answers at 2.5x their floor"
        );
        assert_eq!(after_it.knee, Some(in_force * KNEE_MARGIN));
    }

    #[test]
    fn the_first_push_back_halves_the_pace_and_a_later_one_takes_a_third_off() {
        // Arrange: a host never pushed back, and one with a knee from a push-back at 10 s.
        let new = HostState::default();
        let kneed = HostState {
            knee: Some(2.0),
            ..slowed(4.0, 10_000)
        };
        let pushed_back = |state: &HostState, now: Millis| {
            let sign = (Sign::PushedBack(None), None);
            trouble(state, sign, (now - 10, now), Some(20.0)).and_then(|t| t.slowdown)
        };

        // Act
        let first = pushed_back(&new, 10);
        let above_the_knee = pushed_back(&kneed, 15_000);
        let past_the_knee = pushed_back(&kneed, 60_000);

        // Assert
        assert_eq!(first, Some(FIRST_DECREASE), "no knee yet");
        let slowed_by = |now: Millis| kneed.slowdown_at(now) * DECREASE;
        assert_eq!(above_the_knee, Some(slowed_by(15_000)), "coming back to it");
        assert_eq!(past_the_knee, Some(slowed_by(60_000)), "probing past it");
    }

    #[test]
    fn a_push_back_from_a_site_queueing_our_requests_drops_the_pace_as_far_as_its_answers_slowed() {
        // Arrange: answers at 3, 6 and 1.1 times a 200 ms floor, and a 10 ms site at 40 ms.
        let queueing = |mean: f64, knee: Option<f64>| HostState {
            answers: Some((mean, 200.0)),
            knee,
            ..HostState::default()
        };
        let pushed_back = |state: &HostState| {
            let sign = (Sign::PushedBack(None), None);
            trouble(state, sign, (0, 10), Some(20.0)).and_then(|t| t.slowdown)
        };

        // Act
        let three_times = pushed_back(&queueing(600.0, Some(1.0)));
        let six_times = pushed_back(&queueing(1_200.0, None));
        let unloaded = pushed_back(&queueing(220.0, Some(1.0)));
        let jittery = pushed_back(&HostState {
            answers: Some((40.0, 10.0)),
            ..HostState::default()
        });

        // Assert
        assert_eq!(three_times, Some(3.0));
        assert_eq!(six_times, Some(MOST_QUEUED_DECREASE), "at most");
        assert_eq!(unloaded, Some(DECREASE), "the usual drop");
        assert_eq!(
            jittery,
            Some(FIRST_DECREASE),
            "a fast site's 30 ms is no queue"
        );
    }

    #[test]
    fn a_push_back_from_a_queueing_site_cools_the_host_until_its_queue_has_drained() {
        // Arrange: answers 400 ms over a 200 ms floor, and a site that does not queue.
        let queueing = HostState {
            answers: Some((600.0, 200.0)),
            knee: Some(1.0),
            ..HostState::default()
        };
        let unloaded = HostState {
            answers: Some((20.0, 20.0)),
            knee: Some(1.0),
            ..HostState::default()
        };
        let cooled = |state: &HostState| {
            let sign = (Sign::PushedBack(None), None);
            trouble(state, sign, (9_000, 10_000), Some(20.0)).and_then(|t| t.cooldown_until)
        };

        // Act
        let (queued, not_queued) = (cooled(&queueing), cooled(&unloaded));

        // Assert: the queue's wait, where one slowed interval (50 ms times 3) is shorter.
        assert_eq!(queued, Some(10_000 + 400));
        assert_eq!(not_queued, Some(10_000 + 75), "one interval slowed by 1.5");
    }

    #[test]
    fn a_drop_restarts_the_schedule_one_slowed_interval_on_and_voids_the_starts_given_before_it() {
        let before = HostState {
            next_start: Some(20_000),
            ..HostState::default()
        };
        let dropped = trouble(
            &before,
            (Sign::PushedBack(None), None),
            (9_000, 10_000),
            Some(10.0),
        );
        let after = HostState {
            slowdown: Some((FIRST_DECREASE, 10_000)),
            next_start: dropped.and_then(|d| d.next_start),
            ..before.clone()
        };

        assert_eq!(
            after.next_start,
            Some(10_000 + 200),
            "the schedule starts again one slowed interval after the drop"
        );
        assert!(voided(&after, 9_000));
        assert!(!voided(&after, 10_500), "given at the slowed pace");
        assert!(!voided(&before, 9_000), "no drop");
    }
}
