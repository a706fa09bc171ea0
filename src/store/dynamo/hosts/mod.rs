//! The hosts' shared state, in the tasks' DynamoDB table. Each host has one item
//! (`HOST#<host>`, sk `HOST`) for the schedule, in-flight slots and cooldown that every
//! sandbox obeys. A second item (sk `ROBOTS`) holds the host's robots.txt as the fleet last
//! fetched it.

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use crate::domain::health::Trouble;
use crate::domain::limits::{
    Ask, Booker, Grant, Host, HostState, MAX_ROBOTS_BYTES, Millis, Slot, Tail, decide,
};
use crate::ports::error::StoreError;
use crate::ports::hosts::{HostStore, PushedBack, Robots, RobotsRecord, Taken};
use crate::store::dynamo::attributes::{Item, n, number, s, string};

use crate::store::dynamo::keys::host_key;
use crate::store::dynamo::tasks;
use crate::store::dynamo::{DynamoTaskStore, is_condition_failure};

pub use crate::domain::limits::MAX_SLOTS;
/// A robots.txt is kept gzipped in its item, up to this size. A DynamoDB item holds 400 KB.
/// Of a file that does not compress to this size, only the first bytes that do are kept.
pub const MAX_KEPT_ROBOTS_BYTES: usize = 350 * 1024;

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
        knee: number(item, "slowdown_knee"),
        answers: number(item, "answer_ms").zip(number(item, "floor_ms")),
        cooldown_ms: number(item, "cooldown_ms"),
        failing_until: number(item, "failing_until"),
        tail: tail_of(item),
        given_back: number(item, "given_back_from").zip(number(item, "given_back_at")),
    }
}

/// Whether `booker`'s stretch of bookings ends the schedule in `state`, so a start it takes
/// goes on with it.
fn continues(state: &HostState, booker: &Booker) -> bool {
    state
        .tail
        .as_ref()
        .is_some_and(|tail| tail.run == *booker && Some(tail.until) == state.next_start)
}

/// The schedule's tail, if the item names one whole (the previous release writes none).
fn tail_of(item: &Item) -> Option<Tail> {
    Some(Tail {
        run: Booker::parse(string(item, "tail_run")?)?,
        from: number(item, "tail_from")?,
        until: number(item, "tail_until")?,
    })
}

impl HostStore for DynamoTaskStore {
    async fn take_host(
        &self,
        host: &Host,
        ask: &Ask,
        seen: &HostState,
        booker: Option<&Booker>,
    ) -> Result<Taken, StoreError> {
        // The sandbox's view guesses the schedule. Slots are only ever judged on the item
        // itself, because the view does not see other sandboxes give theirs back.
        let guess = HostState {
            slots: Vec::new(),
            ..seen.clone()
        };
        let (mut state, mut ask) = (guess, *ask);
        // A wrong guess (busy or idle, or a slot another fetch took) is corrected once, from
        // the host item as it is.
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
            let tail = booker.map(|run| (run, continues(&state, run)));
            match writes::host_take(&ask, busy, tail)
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
                Err(err) if is_condition_failure(&err) => state = refused_state(&err),
                Err(err) => return Err(StoreError::from_sdk("UpdateItem(host)", err)),
            }
        }
        Ok((decide(&state, &ask).0.waiting(), state, None))
    }

    async fn give_back(
        &self,
        host: &Host,
        tail: &Tail,
        to: Millis,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "HOST")));
        match writes::host_give_back(tail, to, now)
            .apply_to(request)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(err) if is_condition_failure(&err) => Ok(false),
            Err(err) => Err(StoreError::from_sdk("UpdateItem(host)", err)),
        }
    }

    async fn booker_wants_work(&self, booker: &Booker) -> Result<bool, StoreError> {
        let parents = tasks::parents_of(self, &booker.job_id, &booker.run_id).await?;
        Ok(parents.want_work())
    }

    async fn host(&self, host: &Host) -> Result<HostState, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "HOST")))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetItem(host)", e))?;
        Ok(out.item.as_ref().map(host_state).unwrap_or_default())
    }

    async fn leave_host(
        &self,
        host: &Host,
        slot: Slot,
        answers: Option<(f64, f64)>,
    ) -> Result<(), StoreError> {
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "HOST")));
        match writes::host_leave(slot, answers)
            .apply_to(request)
            .send()
            .await
        {
            // A slot that lapsed is another fetch's now.
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Ok(()),
            Err(err) => Err(StoreError::from_sdk("UpdateItem(host)", err)),
        }
    }

    async fn push_back(
        &self,
        host: &Host,
        seen: &HostState,
        trouble: Trouble,
        now: Millis,
    ) -> Result<PushedBack, StoreError> {
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "HOST")))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let expression = writes::host_push_back(seen, trouble, now);
        match expression.apply_to(request).send().await {
            Ok(_) => Ok(PushedBack::Recorded),
            Err(err) if is_condition_failure(&err) => {
                Ok(PushedBack::Refused(Box::new(refused_state(&err))))
            }
            Err(err) => Err(StoreError::from_sdk("UpdateItem(host)", err)),
        }
    }

    async fn robots(&self, host: &Host) -> Result<Option<RobotsRecord>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "ROBOTS")))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("GetItem(robots)", e))?;
        let Some(item) = out.item else {
            return Ok(None);
        };
        let record = robots_record(&item);
        if record.is_none() {
            expire_robots(self, host, &item).await?;
        }
        Ok(record)
    }

    async fn take_robots_fetch(
        &self,
        host: &Host,
        now: Millis,
        until: Millis,
    ) -> Result<bool, StoreError> {
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(host_key(host.as_str(), "ROBOTS")));
        match writes::robots_take(now, until)
            .apply_to(request)
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(err) if is_condition_failure(&err) => Ok(false),
            Err(err) => Err(StoreError::from_sdk("UpdateItem(robots)", err)),
        }
    }

    async fn put_robots(
        &self,
        host: &Host,
        record: RobotsRecord,
    ) -> Result<RobotsRecord, StoreError> {
        let mut item = host_key(host.as_str(), "ROBOTS");
        item.insert("status".into(), s(record.rules.kind()));
        item.insert("expires_at".into(), n(record.expires_at));
        if record.failures > 0 {
            item.insert("failures".into(), n(record.failures));
        }
        if record.rules == Robots::ProxyFailed {
            item.insert("ours".into(), AttributeValue::Bool(true));
        }
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
            .map_err(|e| StoreError::from_sdk("PutItem(robots)", e))?;
        Ok(record)
    }

    async fn hold_robots_paid(
        &self,
        host: &Host,
        day: &str,
        (hold, budget): (u64, u64),
    ) -> Result<bool, StoreError> {
        let Some(write) = writes::robots_paid_earmark(hold, budget) else {
            return Ok(false);
        };
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(robots_spend_key(host, day)));
        match write.apply_to(request).send().await {
            Ok(_) => Ok(true),
            Err(err) if is_condition_failure(&err) => Ok(false),
            Err(err) => Err(StoreError::from_sdk("UpdateItem(robots spend)", err)),
        }
    }

    async fn settle_robots_paid(
        &self,
        host: &Host,
        day: &str,
        (hold, spent): (u64, u64),
    ) -> Result<(), StoreError> {
        let request = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(robots_spend_key(host, day)));
        let settled = writes::robots_paid_settle(hold, spent).apply_to(request);
        settled
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("UpdateItem(robots spend)", e))?;
        Ok(())
    }
}

/// The item of a host's paid-tier spend on robots.txt for one UTC day.
pub(crate) fn robots_spend_key(host: &Host, day: &str) -> Item {
    host_key(host.as_str(), &format!("ROBOTS_SPEND#{day}"))
}

/// The host item as it was when a conditional write was refused (`ALL_OLD`).
fn refused_state<R>(err: &SdkError<UpdateItemError, R>) -> HostState {
    let old = err.as_service_error().and_then(|e| match e {
        UpdateItemError::ConditionalCheckFailedException(c) => c.item.as_ref(),
        _ => None,
    });
    old.map(host_state).unwrap_or_default()
}

/// A robots.txt as its item keeps it: the body and its gzip. While the gzip is over
/// [`MAX_KEPT_ROBOTS_BYTES`], the body is cut by the excess, or by a sixteenth of its length
/// if that is more.
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

/// A kept body: gzipped (`body_gz`), or whole (`body`, type B) as an earlier release kept it.
fn robots_body(item: &Item) -> Option<Vec<u8>> {
    if let Some(gzipped) = item.get("body_gz") {
        return gunzip(gzipped.as_b().ok()?.as_ref());
    }
    let body = item.get("body")?.as_b().ok()?.as_ref();
    Some(body[..body.len().min(MAX_ROBOTS_BYTES)].to_vec())
}

fn robots_record(item: &Item) -> Option<RobotsRecord> {
    let rules = match string(item, "status")? {
        "rules" => Robots::Rules(robots_body(item)?),
        "allow_all" => Robots::AllowAll,
        "unavailable" if item.get("ours").is_some_and(|o| o.as_bool() == Ok(&true)) => {
            Robots::ProxyFailed
        }
        "unavailable" => Robots::Unavailable,
        _ => return None,
    };
    Some(RobotsRecord {
        rules,
        expires_at: number(item, "expires_at")?,
        // The previous release writes no count: a failure it wrote counts as the first.
        failures: number::<u64>(item, "failures")
            .map_or(0, |f| u32::try_from(f).unwrap_or(u32::MAX)),
    })
}

pub mod operator;
pub(crate) mod writes;

/// A robots item this release cannot read (an unknown status, or a body missing or not
/// gzip) would hold its host's records until it expired. So its expiry is removed, if
/// the item still has the expiry that was read. Then the next sandbox takes the fetch
/// and writes the item anew.
async fn expire_robots(
    store: &DynamoTaskStore,
    host: &Host,
    item: &Item,
) -> Result<(), StoreError> {
    let Some(seen) = item.get("expires_at") else {
        return Ok(());
    };
    tracing::warn!(
        host = host.as_str(),
        "the host's robots.txt item cannot be read: fetched again"
    );
    let request = store
        .client
        .update_item()
        .table_name(&store.table)
        .set_key(Some(host_key(host.as_str(), "ROBOTS")));
    match writes::robots_expire(seen.clone())
        .apply_to(request)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        // Written anew (or expired) by another sandbox since it was read.
        Err(err) if is_condition_failure(&err) => Ok(()),
        Err(err) => Err(StoreError::from_sdk("UpdateItem(robots)", err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_robots_item_the_last_release_wrote_with_a_plain_body_is_read() {
        let file = b"User-agent: *\nDisallow: /private\n".to_vec();
        let mut item = Item::from([
            ("status".to_owned(), s("rules")),
            ("expires_at".to_owned(), n(1_000)),
            ("body".to_owned(), AttributeValue::B(file.clone().into())),
        ]);

        let read = robots_record(&item);
        item.remove("body");

        assert_eq!(
            read,
            Some(RobotsRecord {
                rules: Robots::Rules(file),
                expires_at: 1_000,
                failures: 0,
            })
        );
        assert_eq!(robots_record(&item), None, "no body: cannot be read");
    }

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
