//! A page's redirects, each a request of its own host. A fetch that answers with a redirect
//! (or with a `304` that does not confirm the validators sent) is followed by another trip
//! through admit and fetch: the target's robots.txt, its host's turn and slot, and a fetch.
//! A wait on the way parks the record like any wait; its copy carries the chain
//! (`domain::hops`) and goes on from there.

use crate::batch::Invocation;
use crate::domain::hops::Hops;
use crate::domain::spend::Spend;
use crate::ports::hosts::HostStore;
use crate::ports::queue::Visibility;
use crate::ports::results::ResultStore;
use crate::ports::spend::SpendStore;
use crate::ports::tasks::TaskStore;
use crate::scraper::{FetchError, Fetcher};

use super::fetch::Scraped;
use super::guard::Guarded;
use super::parents::Wanted;
use super::parse::Delivery;
use super::{Step, Worker};

/// A delivery that carries a chain goes on with its next hop: that URL, without the
/// earlier result's validators if it is to be fetched in full.
pub(super) fn resumed(guarded: Guarded, chain: Option<&Hops>) -> Guarded {
    let Some(chain) = chain else {
        return guarded;
    };
    Guarded {
        url: Some(chain.next.clone()),
        prior: guarded.prior.filter(|_| !chain.in_full),
        redirected: !chain.before.is_empty(),
        ..guarded
    }
}

/// The chain after `scraped`, if it leads to another request: a redirect, or a `304` that
/// did not confirm the validators sent. `chain` is where the chain stood. A redirect past
/// `most` hops fails the page for good instead.
pub(super) fn next_hop(scraped: &mut Scraped, chain: Option<&Hops>, most: usize) -> Option<Hops> {
    let fetched = scraped.url.as_deref()?;
    let moved = scraped.page.as_ref().err().filter(|e| e.moved_to.is_some());
    if let Some(FetchError {
        moved_to: Some(to),
        http_status,
        ..
    }) = moved
    {
        let too_many = match Hops::redirected(chain, fetched, to.as_str(), most) {
            Ok(next) => return Some(next),
            Err(too_many) => FetchError::permanent(too_many.to_string()),
        };
        let http_status = *http_status;
        scraped.page = Err(FetchError {
            http_status,
            ..too_many
        });
        return None;
    }
    let unconfirmed = match (&scraped.page, &scraped.prior) {
        (Ok(page), Some(prior)) => {
            page.not_modified() && !prior.validators.confirmed_by(&page.validators)
        }
        _ => false,
    };
    if !unconfirmed {
        return None;
    }
    let answered = scraped.page.as_ref().map(|page| &page.validators).ok();
    tracing::info!(
        ?answered,
        "a 304 that does not confirm what was sent: asked in full"
    );
    Some(Hops::in_full(chain, fetched))
}

impl<T: TaskStore + HostStore + SpendStore, R: ResultStore, F: Fetcher, V: Visibility>
    Worker<T, R, F, V>
{
    /// The next hop of the chain, through admit and fetch as any request. What the hops
    /// before it spent is added to its own, or recorded if the record ends here.
    pub(super) async fn hop(
        &self,
        delivery: &Delivery,
        before: Scraped,
        chain: &Hops,
        invocation: &Invocation,
    ) -> Step<Scraped> {
        let spent = before.spend;
        let guarded = Guarded {
            url: Some(chain.next.clone()),
            prior: before.prior.filter(|_| !chain.in_full),
            wanted: before.wanted,
            booked: None,
            tries: delivery.tries(),
            spent: before.claim.spent,
            redirected: !chain.before.is_empty(),
            followed: true,
            claim: Some(before.claim),
        };
        let wanted = guarded.wanted.clone();
        let scraped = match self.admit(delivery, guarded, invocation).await {
            Ok(admitted) => self.scrape(delivery, admitted, invocation).await,
            Err(ended) => Err(ended),
        };
        match scraped {
            Ok(scraped) => Ok(Scraped {
                spend: spent.plus(&scraped.spend),
                ..scraped
            }),
            Err(ended) => {
                self.spent_on_the_way(delivery, &wanted, spent, invocation)
                    .await;
                Err(ended)
            }
        }
    }

    /// Records what the hops before a record's end spent, since no terminal write counts it.
    async fn spent_on_the_way(
        &self,
        delivery: &Delivery,
        wanted: &Wanted,
        spend: Spend,
        invocation: &Invocation,
    ) {
        let mut stores = self.stores(wanted, false, invocation);
        stores.delivery = delivery.id.clone();
        stores.spend = spend;
        self.record_spend(delivery.task(), &stores).await;
    }
}
