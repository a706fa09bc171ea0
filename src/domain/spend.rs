//! What fetching through proxies costs: requests and bytes received, per proxy tier.

/// The most proxy tiers `PROXY_URLS` may name.
pub const MAX_TIERS: usize = 4;

/// A run's paid-tier account's answer to a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    Granted,
    /// What sandboxes gave back as spent has reached the budget (or the run has none).
    Spent,
    /// Reserved to the end, but not all spent: fetches in flight, or sandboxes that have not
    /// given back yet, hold the rest. Worth asking again soon.
    Held,
}

/// Requests sent and body bytes received through one tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierSpend {
    pub requests: u64,
    pub bytes: u64,
}

impl TierSpend {
    pub fn is_zero(&self) -> bool {
        self.requests == 0 && self.bytes == 0
    }
}

/// The spend of one delivery's fetch (or of a run, summed), tier by tier; tier 1 is the
/// first of `PROXY_URLS`. A direct fetch spends nothing here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spend {
    tiers: [TierSpend; MAX_TIERS],
}

impl Spend {
    /// Adds one request's bytes to `tier` (1-based); a tier past [`MAX_TIERS`] is ignored
    /// (config refuses it).
    pub fn add(&mut self, tier: usize, requests: u64, bytes: u64) {
        if let Some(spend) = tier.checked_sub(1).and_then(|i| self.tiers.get_mut(i)) {
            spend.requests += requests;
            spend.bytes += bytes;
        }
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
        self.spent().next().is_none()
    }

    /// Both spends together.
    pub fn plus(mut self, other: &Spend) -> Spend {
        for (tier, spend) in other.spent() {
            self.add(tier, spend.requests, spend.bytes);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_adds_up_by_tier_and_ignores_tiers_that_cannot_be() {
        let mut spend = Spend::default();

        spend.add(1, 1, 100);
        spend.add(2, 1, 50);
        spend.add(1, 1, 10);
        spend.add(0, 1, 1);
        spend.add(MAX_TIERS + 1, 1, 1);

        assert_eq!(
            spend.tier(1),
            TierSpend {
                requests: 2,
                bytes: 110
            }
        );
        assert_eq!(spend.spent().count(), 2);
        assert_eq!(spend.plus(&spend).tier(2).bytes, 100);
        assert!(Spend::default().is_zero());
    }
}
