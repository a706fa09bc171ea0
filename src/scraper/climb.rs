//! Climbing the proxy tiers. A fetch tries its first tier, and a block moves it up to the
//! next. The paid tier is held back unless the fetch may use it. The HTTP fetcher and the
//! renderer's browser climb the same way; each says how it tries one tier.

use std::future::Future;

use super::{Ask, FetchError, Fetched};
use crate::domain::model::Page;
use crate::domain::spend::{Spend, TierSpend};

/// The reason a task fails when only the paid tier could fetch it and the run's budget for
/// that tier is spent.
pub const PAID_TIER_SPENT: &str = "the run's budget for the paid proxy tier is spent";

/// One tier's try: the page or why there is none, and what went through the tier's proxy.
pub type TierTry = (Result<Page, FetchError>, TierSpend);

/// Tries the tiers from `ask.first_tier` up to `tiers`, the last one only if `ask.paid_tier`,
/// while the answer is a block. `attempt(tier)` tries one tier; `None` when it has no proxy.
pub async fn climb<F, Fut>(tiers: usize, ask: &Ask<'_>, mut attempt: F) -> Fetched
where
    F: FnMut(usize) -> Option<Fut>,
    Fut: Future<Output = TierTry>,
{
    let usable = tiers - usize::from(!ask.paid_tier);
    let withheld = usable < tiers;
    let (mut spend, mut tier) = (Spend::default(), ask.first_tier.max(1));
    while let Some(trying) = (tier <= usable).then(|| attempt(tier)).flatten() {
        let (page, mut meter) = trying.await;
        meter.blocks = u64::from(page.as_ref().is_err_and(|e| e.block.is_some()));
        spend.add(tier, meter);
        match page {
            Err(err) if err.blocked && tier < usable => {
                tracing::info!(tier, reason = %err.reason, "blocked: the next tier");
                tier += 1;
                continue;
            }
            Err(err) if err.blocked && withheld => {
                let reason = format!("{}; {PAID_TIER_SPENT}", err.reason);
                let page = Err(FetchError { reason, ..err });
                return Fetched {
                    page,
                    spend,
                    wants_paid_tier: true,
                };
            }
            page => {
                return Fetched {
                    page,
                    spend,
                    wants_paid_tier: false,
                };
            }
        }
    }
    // No tier could be asked, because the only tier there is, is the paid one.
    let page = Err(FetchError::permanent(PAID_TIER_SPENT));
    Fetched {
        page,
        spend,
        wants_paid_tier: withheld,
    }
}
