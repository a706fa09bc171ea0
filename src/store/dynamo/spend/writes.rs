//! The writes of a run's spend: a delivery's spend, counted once, and the paid tier's budget,
//! reserved, noted and returned.

use crate::domain::spend::Spend;
use crate::store::dynamo::attributes::{n, s};
use crate::store::dynamo::expressions::Expression;

/// The names of tier `tier`'s spend on a counter item: requests, body bytes received,
/// and bytes on the wire.
pub fn spend_names(tier: usize) -> [String; 3] {
    [
        format!("proxy_requests_t{tier}"),
        format!("proxy_bytes_t{tier}"),
        format!("proxy_wire_bytes_t{tier}"),
    ]
}

/// The name of the blocks met through tier `tier` on a counter item. Tier 0 means direct.
pub fn blocks_name(tier: usize) -> String {
    match tier {
        0 => "blocks_direct".to_owned(),
        tier => format!("blocks_t{tier}"),
    }
}

/// One delivery's spend added to an existing counter item (run or shard), alone.
pub(crate) fn spend(spend: &Spend) -> Expression {
    Expression::new(String::new(), "attribute_exists(pk)").with_spend(spend)
}

/// Reserves a chunk of the run's paid-tier budget, while what is reserved is below the
/// budget.
pub(crate) fn reserve_paid(chunk: u64) -> Expression {
    Expression::new(
        "SET paid_tier_reserved_bytes = if_not_exists(paid_tier_reserved_bytes, :zero) + :chunk"
            .into(),
        "attribute_exists(paid_tier_budget_bytes) AND \
     (attribute_not_exists(paid_tier_reserved_bytes) \
     OR paid_tier_reserved_bytes < paid_tier_budget_bytes)",
    )
    .value(":zero", n(0))
    .value(":chunk", n(chunk))
}

/// A holder's lease on `chunk` more bytes, extended to `expires_at_ms`.
pub(crate) fn lease(chunk: u64, expires_at_ms: u64) -> Expression {
    Expression::new(
        "SET expires_at_ms = :expires, spent = if_not_exists(spent, :zero) ADD reserved :chunk"
            .into(),
        "",
    )
    .value(":expires", n(expires_at_ms))
    .value(":zero", n(0))
    .value(":chunk", n(chunk))
}

/// A paid fetch's spend noted on its holder's lease, while the lease is there.
pub(crate) fn note_paid(bytes: u64) -> Expression {
    Expression::new("ADD spent :bytes".into(), "attribute_exists(pk)").value(":bytes", n(bytes))
}

/// The name of the task's attribute that holds the delivery whose paid spend was noted on a
/// lease.
pub(crate) const PAID_NOTED_BY: &str = "paid_noted_by";

/// Names on the task item the delivery whose paid spend is noted in the same transaction.
/// Refused if that delivery is named already, so its spend is noted once.
pub(crate) fn paid_noted_by(delivery: &str) -> Expression {
    Expression::new(
        format!("SET {PAID_NOTED_BY} = :delivery"),
        &format!(
            "attribute_exists(pk) AND \
             (attribute_not_exists({PAID_NOTED_BY}) OR {PAID_NOTED_BY} <> :delivery)"
        ),
    )
    .value(":delivery", s(delivery))
}

/// Gives back `unspent` reserved bytes, and counts `spent`. The reserved bytes never go
/// below zero. `unspent` is below 0 when more was spent than reserved.
pub(crate) fn return_paid(unspent: i64, spent: u64) -> Expression {
    Expression::new(
        "SET paid_tier_reserved_bytes = paid_tier_reserved_bytes - :unspent \
         ADD paid_tier_spent_bytes :spent"
            .into(),
        "paid_tier_reserved_bytes >= :unspent",
    )
    .value(":unspent", n(unspent))
    .value(":spent", n(spent))
}
