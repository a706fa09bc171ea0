//! The hosts' shared state, one DynamoDB item each in the tasks' table: the schedule, the
//! in-flight slots and the cooldown every sandbox obeys (`HOST#<host>`, sk `HOST`), and the
//! host's robots.txt as the fleet last fetched it (sk `ROBOTS`).

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use crate::domain::limits::{Ask, Grant, Host, HostState, MAX_ROBOTS_BYTES, Millis, decide};
use crate::store::dynamo::attributes::{Item, n, number, s, string};
use crate::store::dynamo::expressions;
use crate::store::dynamo::keys::host_key;
use crate::store::dynamo::tasks::{DynamoTaskStore, is_condition_failure};
use crate::store::error::AwsError;

pub use crate::domain::limits::MAX_SLOTS;
/// A robots.txt is kept gzipped in its item up to this size (a DynamoDB item holds 400 KB);
/// a file that does not compress to it is kept to its first bytes that do.
pub const MAX_KEPT_ROBOTS_BYTES: usize = 350 * 1024;

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

    /// Gives a fetch's slot back (if it is still the fetch's).
    fn leave_host(
        &self,
        host: &Host,
        slot: (usize, Millis),
    ) -> impl Future<Output = Result<(), AwsError>> + Send;

    /// Records the host's push-back, `(cooldown end, slowdown)` computed from `seen` (the
    /// item as read), only if it lengthens the cooldown in force: a later, weaker answer
    /// never shortens it. False when a longer cooldown stood.
    fn push_back(
        &self,
        host: &Host,
        push_back: (Millis, f64),
        now: Millis,
    ) -> impl Future<Output = Result<bool, AwsError>> + Send;

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

    /// Stores the fleet's copy; answers it as kept (a file cut to what the item holds), so
    /// the sandbox that fetched it parses the same bytes as every other.
    fn put_robots(
        &self,
        host: &Host,
        record: RobotsRecord,
    ) -> impl Future<Output = Result<RobotsRecord, AwsError>> + Send;
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

    async fn leave_host(&self, host: &Host, slot: (usize, Millis)) -> Result<(), AwsError> {
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "HOST")));
        match expressions::host_leave(slot).apply_to(request).send().await {
            // A slot that lapsed is another fetch's now.
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(AwsError::from_sdk("UpdateItem(host)", err)),
        }
    }

    async fn push_back(
        &self,
        host: &Host,
        push_back: (Millis, f64),
        now: Millis,
    ) -> Result<bool, AwsError> {
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "HOST")));
        let expression = expressions::host_push_back(push_back, now);
        match expression.apply_to(request).send().await {
            Ok(_) => Ok(true),
            Err(err) if is_condition_failure(&err) => Ok(false),
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

    async fn put_robots(
        &self,
        host: &Host,
        record: RobotsRecord,
    ) -> Result<RobotsRecord, AwsError> {
        let mut item = host_key(host.as_str(), "ROBOTS");
        item.insert("status".into(), s(record.rules.kind()));
        item.insert("expires_at".into(), n(record.expires_at));
        let record = match record.rules {
            Robots::Rules(body) => {
                let (kept, gzipped) = kept_robots(body);
                item.insert("body_gz".into(), AttributeValue::B(gzipped.into()));
                RobotsRecord {
                    rules: Robots::Rules(kept),
                    ..record
                }
            }
            _ => record,
        };
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| AwsError::from_sdk("PutItem(robots)", e))?;
        Ok(record)
    }
}

/// A robots.txt as its item keeps it: the body and its gzip, cut (by halves of what is
/// left over) until the gzip fits in [`MAX_KEPT_ROBOTS_BYTES`].
pub fn kept_robots(mut body: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    loop {
        let gzipped = gzip(&body);
        if gzipped.len() <= MAX_KEPT_ROBOTS_BYTES {
            return (body, gzipped);
        }
        let over = gzipped.len() - MAX_KEPT_ROBOTS_BYTES;
        body.truncate(body.len().saturating_sub(over.max(body.len() / 16)));
    }
}

fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    let _ = encoder.write_all(body);
    encoder.finish().unwrap_or_default()
}

/// A kept body, at most [`MAX_ROBOTS_BYTES`] however it was written.
fn gunzip(gzipped: &[u8]) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut body = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .take(MAX_ROBOTS_BYTES as u64)
        .read_to_end(&mut body)
        .ok()?;
    Some(body)
}

fn robots_record(item: &Item) -> Option<RobotsRecord> {
    let rules = match string(item, "status")? {
        "rules" => Robots::Rules(gunzip(item.get("body_gz")?.as_b().ok()?.as_ref())?),
        "allow_all" => Robots::AllowAll,
        "unavailable" => Robots::Unavailable,
        _ => return None,
    };
    Some(RobotsRecord {
        rules,
        expires_at: number(item, "expires_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_robots_txt_of_500_kib_is_kept_whole_and_an_incompressible_one_to_what_fits() {
        let text: Vec<u8> = (0..MAX_ROBOTS_BYTES)
            .map(|i| b"Disallow: /private/\n"[i % 20])
            .collect();
        let mut noise = vec![0u8; MAX_ROBOTS_BYTES];
        fastrand::Rng::with_seed(7).fill(&mut noise);

        let (kept_text, gz_text) = kept_robots(text.clone());
        let (kept_noise, gz_noise) = kept_robots(noise.clone());

        assert_eq!(kept_text, text);
        assert_eq!(gunzip(&gz_text), Some(text));
        assert!(gz_noise.len() <= MAX_KEPT_ROBOTS_BYTES);
        assert!(kept_noise.len() > MAX_KEPT_ROBOTS_BYTES * 9 / 10);
        assert_eq!(gunzip(&gz_noise), Some(kept_noise.clone()));
        assert_eq!(&noise[..kept_noise.len()], &kept_noise[..]);
    }
}
