//! `conveyor-ops host show|reset`: a host's politeness state as the fleet shares it (its
//! schedule, slowdown, cooldown, in-flight slots and robots.txt), in plain words, and its
//! reset so the host's work flows at once.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Value, json};

use conveyor_worker::domain::limits::{Host, HostState, Millis};
use conveyor_worker::domain::time::rfc3339;
use conveyor_worker::ports::error::StoreError;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::dynamo::hosts::operator;
use conveyor_worker::store::dynamo::hosts::operator::{RobotsItem, RobotsSpend, ScheduleItem};

/// A host's items, read at `now`.
#[derive(Debug, Clone, PartialEq)]
pub struct HostReport {
    pub host: Host,
    pub now: Millis,
    pub schedule: Option<ScheduleItem>,
    pub robots: Option<RobotsItem>,
    /// What robots.txt spent on the paid proxy tier today (UTC).
    pub robots_paid: Option<RobotsSpend>,
}

/// What a reset cleared: the schedule item as it was, and the robots.txt item deleted (only
/// asked with `robots`).
#[derive(Debug, Clone, PartialEq)]
pub struct Reset {
    pub host: Host,
    pub now: Millis,
    pub schedule: Option<ScheduleItem>,
    pub robots: Option<RobotsItem>,
}

/// The host's items. An error when it has none: the fleet never kept state for that key.
pub async fn show(
    store: &DynamoTaskStore,
    host: &Host,
    now: Millis,
) -> Result<HostReport, StoreError> {
    let schedule = operator::schedule_item(store, host).await?;
    let robots = operator::robots_item(store, host).await?;
    if schedule.is_none() && robots.is_none() {
        return Err(no_items(host, "no items"));
    }
    let today = rfc3339(UNIX_EPOCH + Duration::from_millis(now));
    let robots_paid = operator::robots_spend(store, host, &today[..10]).await?;
    Ok(HostReport {
        host: host.clone(),
        now,
        schedule,
        robots,
        robots_paid,
    })
}

/// Clears the host's schedule item, and with `robots` deletes its robots.txt item. An
/// error when the host had none of what was asked.
pub async fn reset(
    store: &DynamoTaskStore,
    host: &Host,
    robots: bool,
    now: Millis,
) -> Result<Reset, StoreError> {
    let schedule = operator::reset_schedule(store, host, now).await?;
    let forgotten = match robots {
        true => operator::forget_robots(store, host).await?,
        false => None,
    };
    if schedule.is_none() && forgotten.is_none() {
        let what = match robots {
            true => "no schedule or robots.txt item",
            false => "no schedule item",
        };
        return Err(no_items(host, what));
    }
    Ok(Reset {
        host: host.clone(),
        now,
        schedule,
        robots: forgotten,
    })
}

fn no_items(host: &Host, what: &str) -> StoreError {
    StoreError::NotAllowed {
        detail: format!(
            "host {host} has {what}: check the key (a job keyed by domain or address keeps \
             `domain:<domain>` or `address:<ip>`), or give a URL of the host",
            host = host.as_str()
        ),
    }
}

impl HostReport {
    /// The report in plain words, one line each, times relative to now.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!("host {}", self.host.as_str())];
        match &self.schedule {
            Some(item) => lines.extend(schedule_lines(item, self.now)),
            None => lines.push(row("schedule", "no item: nothing booked, no cooldown")),
        }
        lines.push("robots.txt".into());
        match &self.robots {
            Some(robots) => lines.extend(robots_lines(robots, self.now)),
            None => lines.push(row("item", "none: fetched by the host's next task")),
        }
        let paid = self.robots_paid.unwrap_or_default();
        let held = match paid.held {
            0 => String::new(),
            held => format!(", {held} held"),
        };
        let today = format!(
            "{} bytes in {} fetches today (UTC){held}",
            paid.spent, paid.fetches
        );
        lines.push(row("paid tier", today));
        lines
    }

    /// The report for scripts: every time in ms since the epoch.
    pub fn json(&self) -> Value {
        json!({
            "host": self.host.as_str(),
            "now": self.now,
            "schedule": self.schedule.as_ref().map(|s| schedule_json(s, self.now)),
            "robots": self.robots.as_ref().map(robots_json),
            "robots_paid_today": self.robots_paid.map(|paid| json!({
                "spent_bytes": paid.spent, "held_bytes": paid.held, "fetches": paid.fetches,
            })),
        })
    }
}

impl Reset {
    /// What was cleared, in plain words.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!("host {}: reset", self.host.as_str())];
        match &self.schedule {
            Some(item) => {
                lines.push(row("cleared", cleared(&item.state, self.now)));
                lines.push(row(
                    "void",
                    "starts booked before now: their tasks ask the schedule again at their start",
                ));
            }
            None => lines.push(row("schedule", "no item: nothing to clear")),
        }
        if let Some(robots) = &self.robots {
            let status = robots.status.as_deref().unwrap_or("none");
            let deleted = format!("deleted ({status}): fetched again by the host's next task");
            lines.push(row("robots.txt", deleted));
        }
        lines
    }

    /// What was cleared, for scripts: the items as they were.
    pub fn json(&self) -> Value {
        json!({
            "host": self.host.as_str(),
            "now": self.now,
            "schedule_was": self.schedule.as_ref().map(|s| schedule_json(s, self.now)),
            "robots_deleted": self.robots.as_ref().map(robots_json),
        })
    }
}

/// What a reset of `state` cleared: only what was set.
fn cleared(state: &HostState, now: Millis) -> String {
    let held = (0..state.slots.len())
        .filter(|&i| state.slot_taken(i, now))
        .count();
    let parts = [
        state
            .next_start
            .map(|n| format!("next start ({})", when(n, now))),
        state.tail.as_ref().map(|t| format!("tail (run {})", t.run)),
        state
            .slowdown
            .map(|_| format!("slowdown (x{:.2} now)", state.slowdown_at(now))),
        state.knee.map(|k| format!("knee (x{k:.2})")),
        state
            .cooldown_until
            .map(|u| format!("cooldown ({})", when(u, now))),
        state
            .cooldown_ms
            .map(|ms| format!("failing cooldown length ({})", span(ms))),
        state
            .failing_until
            .map(|u| format!("one probe at a time ({})", when(u, now))),
        (!state.slots.is_empty()).then(|| format!("in-flight slots ({held} held)")),
    ];
    let parts = parts.into_iter().flatten().collect::<Vec<_>>();
    match parts.is_empty() {
        true => "nothing: the schedule was clear".into(),
        false => parts.join(", "),
    }
}

fn row(label: &str, text: impl std::fmt::Display) -> String {
    format!("  {label:<16} {text}")
}

fn schedule_lines(item: &ScheduleItem, now: Millis) -> Vec<String> {
    let state = &item.state;
    let mut lines = vec![row("next start", next_start(state, now))];
    if let Some(tail) = &state.tail {
        let stretch = format!("from {} to {}", when(tail.from, now), when(tail.until, now));
        lines.push(row("tail", format!("run {} booked {stretch}", tail.run)));
    }
    if let Some((from, at)) = state.given_back {
        let given = format!(
            "the schedule from {} on, {}: starts in it booked before then are void",
            when(from, now),
            when(at, now)
        );
        lines.push(row("given back", given));
    }
    lines.push(row("slowdown", slowdown(state, now)));
    lines.push(row("cooldown", cooldown(state, now)));
    lines.push(row("in-flight slots", slots(state, now)));
    if let Some((mean, floor)) = state.answers {
        let answers = format!("{mean:.1} ms on average, floor {floor:.1} ms");
        lines.push(row("answer time", answers));
    }
    if let Some(at) = item.touched_at {
        lines.push(row("last turn taken", when(at, now)));
    }
    lines
}

fn next_start(state: &HostState, now: Millis) -> String {
    match state.next_start {
        Some(next) if next > now => format!("{}: booked that far ahead", when(next, now)),
        Some(_) | None => "now: nothing booked ahead".into(),
    }
}

fn slowdown(state: &HostState, now: Millis) -> String {
    let knee = state.knee.map(|k| format!(", knee x{k:.2}"));
    let knee = knee.unwrap_or_default();
    match state.slowdown {
        None => format!("none{knee}"),
        Some((set, at)) => format!(
            "x{:.2} now (x{set:.2} set {}){knee}",
            state.slowdown_at(now),
            when(at, now)
        ),
    }
}

fn cooldown(state: &HostState, now: Millis) -> String {
    let last = state
        .cooldown_ms
        .map(|ms| format!(" (a failing one last lasted {})", span(ms)));
    let mut last = last.unwrap_or_default();
    if let Some(until) = state.failing_until.filter(|until| *until > now) {
        last.push_str(&format!(
            "; failing: one fetch at a time for {}",
            span(until - now)
        ));
    }
    match state.cooldown_until {
        Some(until) if until > now => format!("{} left{last}", span(until - now)),
        Some(until) => format!("none (the last ended {}){last}", when(until, now)),
        None => format!("none{last}"),
    }
}

fn slots(state: &HostState, now: Millis) -> String {
    let held = (0..state.slots.len())
        .filter(|&i| state.slot_taken(i, now))
        .map(|i| format!("slot {i} until {}", when(state.slot_until(i), now)))
        .collect::<Vec<_>>();
    let lapsed = state.slots.iter().flatten().count() - held.len();
    let lapsed = match lapsed {
        0 => String::new(),
        n => format!(" ({n} lapsed, free)"),
    };
    match held.is_empty() {
        true => format!("none held{lapsed}"),
        false => format!("{} held: {}{lapsed}", held.len(), held.join(", ")),
    }
}

fn robots_lines(robots: &RobotsItem, now: Millis) -> Vec<String> {
    let status = match (&robots.status, robots.proxy_failed) {
        (Some(status), true) => format!("{status} (the proxy's answer, not the site's)"),
        (Some(status), false) => status.clone(),
        (None, _) => "none (a fetch was leased, nothing stored yet)".into(),
    };
    let size = robots.gzipped_bytes.map(|b| format!(", {b} bytes gzipped"));
    let mut lines = vec![row(
        "status",
        format!("{status}{}", size.unwrap_or_default()),
    )];
    let expires = match robots.expires_at {
        Some(at) if at > now => format!("{}: the fleet's copy is used until then", when(at, now)),
        Some(at) => format!("{}: fetched again by the host's next task", when(at, now)),
        None => "no expiry: fetched again by the host's next task".into(),
    };
    lines.push(row("expires", expires));
    let lease = match robots.lease_until {
        Some(until) if until > now => {
            format!("a sandbox is fetching it, until {}", when(until, now))
        }
        _ => "none held".into(),
    };
    lines.push(row("fetch lease", lease));
    if robots.failures > 0 {
        let failed = format!(
            "{} in a row: each asked again after a longer gap",
            robots.failures
        );
        lines.push(row("failed fetches", failed));
    }
    lines
}

fn schedule_json(item: &ScheduleItem, now: Millis) -> Value {
    let state = &item.state;
    let slots = (0..state.slots.len())
        .filter(|&i| state.slot_taken(i, now))
        .map(|i| json!({"index": i, "until": state.slot_until(i)}))
        .collect::<Vec<_>>();
    json!({
        "next_start": state.next_start,
        "booked_ahead_ms": state.next_start.map_or(0, |next| next.saturating_sub(now)),
        "tail": state.tail.as_ref().map(|t| json!({
            "run": t.run.to_string(), "from": t.from, "until": t.until,
        })),
        "given_back": state.given_back.map(|(from, at)| json!({"from": from, "at": at})),
        "slowdown_now": state.slowdown_at(now),
        "slowdown": state.slowdown.map(|(factor, at)| json!({"factor": factor, "at": at})),
        "knee": state.knee,
        "cooldown_until": state.cooldown_until,
        "cooldown_left_ms": state.cooldown_until.map_or(0, |u| u.saturating_sub(now)),
        "cooldown_ms": state.cooldown_ms,
        "failing_until": state.failing_until,
        "slots_held": slots,
        "answer_ms": state.answers.map(|(mean, _)| mean),
        "floor_ms": state.answers.map(|(_, floor)| floor),
        "touched_at": item.touched_at,
    })
}

fn robots_json(robots: &RobotsItem) -> Value {
    json!({
        "status": robots.status,
        "proxy_failed": robots.proxy_failed,
        "expires_at": robots.expires_at,
        "lease_until": robots.lease_until,
        "gzipped_bytes": robots.gzipped_bytes,
        "failures": robots.failures,
    })
}

/// A time said from `now`: "in 1m 5s", "3s ago", "now".
pub fn when(at: Millis, now: Millis) -> String {
    match at.cmp(&now) {
        std::cmp::Ordering::Greater => format!("in {}", span(at - now)),
        std::cmp::Ordering::Less => format!("{} ago", span(now - at)),
        std::cmp::Ordering::Equal => "now".into(),
    }
}

/// A length of time, to the second (to the ms under a second).
pub fn span(ms: Millis) -> String {
    if ms < 1_000 {
        return format!("{ms} ms");
    }
    humantime::format_duration(Duration::from_secs(ms / 1_000)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_is_said_from_now_to_the_second() {
        assert_eq!(when(61_500, 0), "in 1m 1s");
        assert_eq!(when(0, 3_400), "3s ago");
        assert_eq!(when(5, 5), "now");
        assert_eq!(span(250), "250 ms");
    }

    #[test]
    fn a_reset_names_only_what_was_set_and_which_slots_were_held() {
        let cooling = HostState {
            cooldown_until: Some(31_000),
            slots: vec![Some(500), Some(20_000)],
            ..HostState::default()
        };

        let said = cleared(&cooling, 1_000);

        assert_eq!(said, "cooldown (in 30s), in-flight slots (1 held)");
        assert_eq!(
            cleared(&HostState::default(), 1_000),
            "nothing: the schedule was clear"
        );
    }

    #[test]
    fn a_hosts_slots_are_said_held_until_a_time_or_lapsed() {
        let state = HostState {
            slots: vec![Some(500), None, Some(20_000)],
            ..HostState::default()
        };

        assert_eq!(
            slots(&state, 1_000),
            "1 held: slot 2 until in 19s (1 lapsed, free)"
        );
        assert_eq!(slots(&HostState::default(), 1_000), "none held");
    }
}
