//! The hosts' shared state, one DynamoDB item each in the tasks' table: the schedule, the
//! in-flight slots and the cooldown every sandbox obeys (`HOST#<host>`, sk `HOST`), and the
//! host's robots.txt as the fleet last fetched it (sk `ROBOTS`).

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use crate::polite::limits::{Ask, Grant, Host, HostState, Millis, decide};
use crate::store::attributes::{Item, n, number, s, string};
use crate::store::error::AwsError;
use crate::store::expressions;
use crate::store::keys::host_key;
use crate::store::tasks::{DynamoTaskStore, is_condition_failure};

/// The most in-flight slots a host item keeps (`HOST_MAX_INFLIGHT` at most this).
pub const MAX_SLOTS: u32 = 64;
/// robots.txt bodies are kept up to this size (a DynamoDB item holds 400 KB).
pub const MAX_ROBOTS_BYTES: usize = 350 * 1024;

/// What the fleet knows of a host's robots.txt, until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RobotsRecord {
    pub rules: Robots,
    pub expires_at: Millis,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Robots {
    /// A robots.txt to obey (its first [`MAX_ROBOTS_BYTES`]).
    Rules(Vec<u8>),
    /// None there (4xx): everything allowed.
    AllowAll,
    /// The host could not say (5xx, unreachable): nothing allowed until it expires.
    Unavailable,
}

impl Robots {
    pub fn kind(&self) -> &'static str {
        match self {
            Robots::Rules(_) => "rules",
            Robots::AllowAll => "allow_all",
            Robots::Unavailable => "unavailable",
        }
    }
}

/// A take's answer: the grant, the host's state, and the slot taken.
pub type Taken = (Grant, HostState, Option<(usize, Millis)>);

/// The port: a host's schedule and robots.txt, shared by every sandbox.
pub trait HostStore: Send + Sync {
    /// Takes the host's schedule for one fetch, if `decide` grants it on the host as it is
    /// now; answers the grant, the host's state after it (or as it was, if not granted) and
    /// the slot taken (another than asked for, if that one was taken and another free).
    /// `seen`: this sandbox's last view of the host, to guess which condition holds.
    fn take_host(
        &self,
        host: &Host,
        ask: &Ask,
        seen: &HostState,
    ) -> impl Future<Output = Result<Taken, AwsError>> + Send;

    /// The host as it is now (a consistent read).
    fn host(&self, host: &Host) -> impl Future<Output = Result<HostState, AwsError>> + Send;

    /// Gives a fetch's slot back and records the host's push-back (cooldown end, slowdown).
    fn leave_host(
        &self,
        host: &Host,
        slot: Option<(usize, Millis)>,
        push_back: Option<(Millis, f64)>,
        now: Millis,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;

    fn robots(
        &self,
        host: &Host,
    ) -> impl Future<Output = Result<Option<RobotsRecord>, AwsError>> + Send;

    /// Takes the fleet's one fetch of the host's robots.txt until `until`; false when a fresh
    /// one is kept or another sandbox is fetching it.
    fn take_robots_fetch(
        &self,
        host: &Host,
        now: Millis,
        until: Millis,
    ) -> impl Future<Output = Result<bool, AwsError>> + Send;

    fn put_robots(
        &self,
        host: &Host,
        record: &RobotsRecord,
    ) -> impl Future<Output = Result<(), AwsError>> + Send;
}

/// A host item as the schedule reads it.
fn host_state(item: &Item) -> HostState {
    let slots = (0..MAX_SLOTS)
        .map(|i| number(item, &format!("slot_{i}")))
        .collect::<Vec<_>>();
    let used = slots.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    HostState {
        next_start: number(item, "next_start"),
        slots: slots[..used].to_vec(),
        cooldown_until: number(item, "cooldown_until"),
        slowdown: number(item, "slowdown").zip(number(item, "slowdown_at")),
    }
}

impl HostStore for DynamoTaskStore {
    async fn take_host(&self, host: &Host, ask: &Ask, seen: &HostState) -> Result<Taken, AwsError> {
        // The view guesses the schedule; slots are only ever judged on the item itself
        // (the view does not see other sandboxes give theirs back).
        let guess = HostState {
            slots: Vec::new(),
            ..seen.clone()
        };
        let (mut state, mut ask) = (guess, *ask);
        // A wrong guess (busy or idle, a slot another took) is corrected by the host as it
        // is, once.
        for _ in 0..2 {
            ask = ask.repicked(&state);
            let (grant, _) = decide(&state, &ask);
            let Grant::StartAt(start) = grant else {
                return Ok((grant, state, None));
            };
            let busy = start > ask.now;
            let request = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(host_key(host.as_str(), "HOST")))
                .return_values(ReturnValue::AllNew)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                );
            match expressions::host_take(&ask, busy)
                .apply_to(request)
                .send()
                .await
            {
                Ok(out) => {
                    let after = host_state(&out.attributes.unwrap_or_default());
                    let start = match (busy, ask.interval, after.next_start) {
                        (true, Some(interval), Some(next)) => next - interval,
                        _ => ask.now,
                    };
                    return Ok((Grant::StartAt(start), after, ask.slot));
                }
                Err(err) if is_condition_failure(&err) => {
                    let old = err.as_service_error().and_then(|e| match e {
                        aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => c.item.clone(),
                        _ => None,
                    });
                    state = old.as_ref().map(host_state).unwrap_or_default();
                }
                Err(err) => return Err(AwsError::from_sdk("UpdateItem(host)", err)),
            }
        }
        Ok((decide(&state, &ask).0.waiting(), state, None))
    }

    async fn host(&self, host: &Host) -> Result<HostState, AwsError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "HOST")))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::from_sdk("GetItem(host)", e))?;
        Ok(out.item.as_ref().map(host_state).unwrap_or_default())
    }

    async fn leave_host(
        &self,
        host: &Host,
        slot: Option<(usize, Millis)>,
        push_back: Option<(Millis, f64)>,
        now: Millis,
    ) -> Result<(), AwsError> {
        if slot.is_none() && push_back.is_none() {
            return Ok(());
        }
        let send = |slot| {
            let request = self
                .client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(host_key(host.as_str(), "HOST")));
            expressions::host_leave(slot, push_back, now)
                .apply_to(request)
                .send()
        };
        match send(slot).await {
            Ok(_) => Ok(()),
            // The slot lapsed and is another fetch's now: only the push-back is left to say.
            Err(err) if is_condition_failure(&err) && push_back.is_some() => send(None)
                .await
                .map(|_| ())
                .map_err(|e| AwsError::from_sdk("UpdateItem(host)", e)),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(AwsError::from_sdk("UpdateItem(host)", err)),
        }
    }

    async fn robots(&self, host: &Host) -> Result<Option<RobotsRecord>, AwsError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "ROBOTS")))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::from_sdk("GetItem(robots)", e))?;
        Ok(out.item.as_ref().and_then(robots_record))
    }

    async fn take_robots_fetch(
        &self,
        host: &Host,
        now: Millis,
        until: Millis,
    ) -> Result<bool, AwsError> {
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "ROBOTS")));
        match expressions::robots_take(now, until)
            .apply_to(request)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(err) if is_condition_failure(&err) => Ok(false),
            Err(err) => Err(AwsError::from_sdk("UpdateItem(robots)", err)),
        }
    }

    async fn put_robots(&self, host: &Host, record: &RobotsRecord) -> Result<(), AwsError> {
        let mut item = host_key(host.as_str(), "ROBOTS");
        item.insert("status".into(), s(record.rules.kind()));
        item.insert("expires_at".into(), n(record.expires_at));
        if let Robots::Rules(body) = &record.rules {
            let kept = &body[..body.len().min(MAX_ROBOTS_BYTES)];
            item.insert("body".into(), AttributeValue::B(kept.to_vec().into()));
        }
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| AwsError::from_sdk("PutItem(robots)", e))
    }
}

fn robots_record(item: &Item) -> Option<RobotsRecord> {
    let rules = match string(item, "status")? {
        "rules" => Robots::Rules(item.get("body")?.as_b().ok()?.as_ref().to_vec()),
        "allow_all" => Robots::AllowAll,
        "unavailable" => Robots::Unavailable,
        _ => return None,
    };
    Some(RobotsRecord {
        rules,
        expires_at: number(item, "expires_at")?,
    })
}
