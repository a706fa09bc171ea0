//! The host items as the operator reads and clears them (`conveyor-ops host show|reset`).

use aws_sdk_dynamodb::types::ReturnValue;

use crate::domain::limits::{Host, HostState, MAX_SLOTS, Millis};
use crate::ports::error::StoreError;
use crate::store::dynamo::attributes::{Item, number, string};
use crate::store::dynamo::keys::host_key;
use crate::store::dynamo::{DynamoTaskStore, is_condition_failure};

use super::{host_state, writes};

/// A host's schedule item (sk `HOST`) as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleItem {
    /// What the schedule reads: next start, tail, slots, cooldown, slowdown, answers.
    pub state: HostState,
    /// When a fetch last took the host's turn.
    pub touched_at: Option<Millis>,
}

/// A host's robots.txt item (sk `ROBOTS`) as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RobotsItem {
    /// `rules`, `allow_all` or `unavailable`. The worker cannot read any other.
    pub status: Option<String>,
    /// The proxy answered the fetch itself: nothing is known of the site's file.
    pub proxy_failed: bool,
    /// When the fleet's copy expires. None: it cannot be read, so it is fetched again.
    pub expires_at: Option<Millis>,
    /// Until when a sandbox holds the lease on the fleet's fetch of it.
    pub lease_until: Option<Millis>,
    /// The kept file's size, gzipped.
    pub gzipped_bytes: Option<usize>,
    /// Fetches that failed in a row: the next is asked after a longer gap.
    pub failures: u32,
}

/// A host's paid-tier spend on robots.txt for one UTC day (sk `ROBOTS_SPEND#<day>`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RobotsSpend {
    /// Bytes spent, as the proxy bills them.
    pub spent: u64,
    /// Bytes held by fetches in flight, or never settled (their sandbox died).
    pub held: u64,
    /// Fetches that took a hold.
    pub fetches: u64,
}

fn schedule_of(item: &Item) -> ScheduleItem {
    ScheduleItem {
        state: host_state(item),
        touched_at: number(item, "touched_at"),
    }
}

fn robots_of(item: &Item) -> RobotsItem {
    let gzipped = item.get("body_gz").or_else(|| item.get("body"));
    RobotsItem {
        status: string(item, "status").map(str::to_owned),
        proxy_failed: item.get("ours").is_some_and(|o| o.as_bool() == Ok(&true)),
        expires_at: number(item, "expires_at"),
        lease_until: number(item, "lease_until"),
        gzipped_bytes: gzipped
            .and_then(|b| b.as_b().ok())
            .map(|b| b.as_ref().len()),
        failures: number(item, "failures").unwrap_or(0),
    }
}

/// The host's schedule item, if it has one.
pub async fn schedule_item(
    store: &DynamoTaskStore,
    host: &Host,
) -> Result<Option<ScheduleItem>, StoreError> {
    let item = host_item(store, host, "HOST", "GetItem(host)").await?;
    Ok(item.as_ref().map(schedule_of))
}

/// The host's robots.txt item, if it has one.
pub async fn robots_item(
    store: &DynamoTaskStore,
    host: &Host,
) -> Result<Option<RobotsItem>, StoreError> {
    let item = host_item(store, host, "ROBOTS", "GetItem(robots)").await?;
    Ok(item.as_ref().map(robots_of))
}

/// The host's paid-tier spend on robots.txt on `day` (UTC, `YYYY-MM-DD`), if any.
pub async fn robots_spend(
    store: &DynamoTaskStore,
    host: &Host,
    day: &str,
) -> Result<Option<RobotsSpend>, StoreError> {
    let sort = format!("ROBOTS_SPEND#{day}");
    let item = host_item(store, host, &sort, "GetItem(robots spend)").await?;
    Ok(item.map(|item| {
        let count = |name| number::<u64>(&item, name).unwrap_or(0);
        let spent = count("spent");
        RobotsSpend {
            spent,
            held: count("used").saturating_sub(spent),
            fetches: count("fetches"),
        }
    }))
}

/// Clears the host's schedule so its next fetch starts at once (`writes::host_reset`).
/// The item as it was, or None when the host has no schedule item.
pub async fn reset_schedule(
    store: &DynamoTaskStore,
    host: &Host,
    now: Millis,
) -> Result<Option<ScheduleItem>, StoreError> {
    let request = store
        .client
        .update_item()
        .table_name(&store.table)
        .set_key(Some(host_key(host.as_str(), "HOST")))
        .return_values(ReturnValue::AllOld);
    match writes::host_reset(now, MAX_SLOTS)
        .apply_to(request)
        .send()
        .await
    {
        Ok(out) => Ok(Some(schedule_of(&out.attributes.unwrap_or_default()))),
        Err(err) if is_condition_failure(&err) => Ok(None),
        Err(err) => Err(StoreError::from_sdk("UpdateItem(host)", err)),
    }
}

/// Deletes the host's robots.txt item, so the host's next task fetches the file again.
/// The item as it was, or None when there was none.
pub async fn forget_robots(
    store: &DynamoTaskStore,
    host: &Host,
) -> Result<Option<RobotsItem>, StoreError> {
    let out = store
        .client
        .delete_item()
        .table_name(&store.table)
        .set_key(Some(host_key(host.as_str(), "ROBOTS")))
        .return_values(ReturnValue::AllOld)
        .send()
        .await
        .map_err(|e| StoreError::from_sdk("DeleteItem(robots)", e))?;
    Ok(out.attributes.as_ref().map(robots_of))
}

async fn host_item(
    store: &DynamoTaskStore,
    host: &Host,
    sort: &str,
    operation: &'static str,
) -> Result<Option<Item>, StoreError> {
    let out = store
        .client
        .get_item()
        .table_name(&store.table)
        .set_key(Some(host_key(host.as_str(), sort)))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| StoreError::from_sdk(operation, e))?;
    Ok(out.item)
}
