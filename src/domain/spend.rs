//! What fetching through proxies costs, per proxy tier: requests, bytes received and bytes
//! on the wire. Also the block pages met on the way, per tier and for direct fetches.

use crate::domain::model::Counting;

/// The most proxy tiers `PROXY_URLS` may name.
pub const MAX_TIERS: usize = 4;

/// A run's paid-tier account's answer to a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    Granted,
    /// What sandboxes reported as spent has reached the budget, or the run has no budget.
    Spent,
    /// The whole budget is reserved, but not all of it is spent. Fetches in flight, or
    /// sandboxes that have not given back yet, hold the rest. Worth asking again soon.
    Held,
}

/// A sandbox's lease on the paid-tier bytes it reserved from a run: whose they are, and
/// until when (milliseconds since the epoch) they count as held. After that, a sandbox that
/// finds the budget held may take them back for the run. So a sandbox that died holding
/// them strands them no longer than the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaidLease {
    /// The sandbox, as its allowances name it (random per cold start).
    pub holder: String,
    pub expires_at_ms: u64,
}

/// Requests sent and bytes through one tier. `bytes` counts the bodies received, decoded, as
/// the pages are stored. `wire_bytes` counts what the proxy carried both ways: request and
/// response headers, bodies as sent, CONNECT and TLS. That is what providers bill. `blocks`
/// counts the responses that were a bot manager's block or challenge page (`domain::blocks`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierSpend {
    pub requests: u64,
    pub bytes: u64,
    pub wire_bytes: u64,
    pub blocks: u64,
}

impl TierSpend {
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// What the paid tier's budget is charged: the wire bytes. Where none were counted (no
    /// relay saw the connection), the body bytes.
    pub fn billed(&self) -> u64 {
        if self.wire_bytes > 0 {
            self.wire_bytes
        } else {
            self.bytes
        }
    }
}

/// The spend of one delivery's fetch, or a run's summed spend, tier by tier. Tier 1 is the
/// first in `PROXY_URLS`. A direct fetch spends nothing here. The blocks it met are counted
/// separately ([`Spend::direct_blocks`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    tiers: [TierSpend; MAX_TIERS],
    direct_blocks: u64,
}

impl Spend {
    /// Adds `spent` to `tier` (1-based). A tier past [`MAX_TIERS`] is ignored. The config
    /// refuses such a tier anyway.
    pub fn add(&mut self, tier: usize, spent: TierSpend) {
        if let Some(spend) = tier.checked_sub(1).and_then(|i| self.tiers.get_mut(i)) {
            spend.requests += spent.requests;
            spend.bytes += spent.bytes;
            spend.wire_bytes += spent.wire_bytes;
            spend.blocks += spent.blocks;
        }
    }

    /// Counts `blocks` met without a proxy.
    pub fn add_direct_blocks(&mut self, blocks: u64) {
        self.direct_blocks += blocks;
    }

    /// The blocks met without a proxy.
    pub fn direct_blocks(&self) -> u64 {
        self.direct_blocks
    }

    /// Every block met, direct and through every tier.
    pub fn blocks(&self) -> u64 {
        self.spent().map(|(_, spend)| spend.blocks).sum::<u64>() + self.direct_blocks
    }

    /// The spend of `tier` (1-based).
    pub fn tier(&self, tier: usize) -> TierSpend {
        tier.checked_sub(1)
            .and_then(|i| self.tiers.get(i))
            .copied()
            .unwrap_or_default()
    }

    /// The tiers that spent anything, 1-based, in order.
    pub fn spent(&self) -> impl Iterator<Item = (usize, TierSpend)> + '_ {
        (1..=MAX_TIERS)
            .map(|tier| (tier, self.tier(tier)))
            .filter(|(_, spend)| !spend.is_zero())
    }

    pub fn is_zero(&self) -> bool {
        self.spent().next().is_none() && self.direct_blocks == 0
    }

    /// The billed amount ([`TierSpend::billed`]) of every tier, summed.
    pub fn billed(&self) -> u64 {
        self.spent().map(|(_, spend)| spend.billed()).sum()
    }

    /// Both spends together.
    pub fn plus(mut self, other: &Spend) -> Spend {
        for (tier, spend) in other.spent() {
            self.add(tier, spend);
        }
        self.direct_blocks += other.direct_blocks;
        self
    }
}

/// One delivery's spend, and the delivery's name (at most 36 characters). A terminal write
/// that counts the spend keeps the name on the task. The same delivery's spend may later be
/// recorded on its own: the write's response was lost, and the write was sent again and
/// refused. The name on the task keeps that spend from being counted twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliverySpend<'a> {
    pub spend: &'a Spend,
    pub delivery: &'a str,
}

/// Where a terminal write counts its task (as its run counts its tasks), and the delivery's
/// spend it adds there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountedIn<'a> {
    pub counting: Counting,
    pub spend: DeliverySpend<'a>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_adds_up_by_tier_and_ignores_tiers_that_cannot_be() {
        let mut spend = Spend::default();
        let spent = |requests, bytes, wire_bytes| TierSpend {
            requests,
            bytes,
            wire_bytes,
            blocks: 0,
        };

        spend.add(1, spent(1, 100, 40));
        spend.add(2, spent(1, 50, 0));
        spend.add(1, spent(1, 10, 5));
        spend.add(0, spent(1, 1, 1));
        spend.add(MAX_TIERS + 1, spent(1, 1, 1));

        assert_eq!(spend.tier(1), spent(2, 110, 45));
        assert_eq!(spend.spent().count(), 2);
        assert_eq!(spend.plus(&spend).tier(2).bytes, 100);
        assert!(Spend::default().is_zero());
        assert_eq!(spend.tier(1).billed(), 45, "the wire, where it was counted");
        assert_eq!(spend.tier(2).billed(), 50);
    }

    #[test]
    fn blocks_add_up_by_tier_and_direct_and_bill_nothing() {
        let mut spend = Spend::default();
        let blocked = TierSpend {
            requests: 1,
            blocks: 1,
            ..TierSpend::default()
        };

        spend.add(1, blocked);
        spend.add(2, blocked);
        spend.add(1, blocked);
        spend.add_direct_blocks(3);

        assert_eq!((spend.tier(1).blocks, spend.tier(2).blocks), (2, 1));
        assert_eq!(spend.blocks(), 6);
        assert_eq!(spend.plus(&spend).direct_blocks(), 6);
        assert_eq!(spend.billed(), 0, "no bytes: nothing billed");
        let mut direct = Spend::default();
        direct.add_direct_blocks(1);
        assert!(!direct.is_zero(), "a direct block is recorded");
    }
}
