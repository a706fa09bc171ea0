//! A page's redirects, each a request of its own host. A fetch that answers with a redirect
//! (or with a `304` that does not confirm the validators sent) is followed by another
//! request: the target's robots.txt, its host's turn and slot, and a fetch.
//! A wait on the way parks the record like any wait; its copy carries the chain
//! (`domain::hops`) and goes on from there.

use crate::domain::hops::Hops;
use crate::scraper::FetchError;

use super::context::Ctx;
use super::fetch::Scraped;
use super::guard::Guarded;

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

/// The request for the chain's next hop, after the request `before`. `spent`: the task's
/// tries were spent (the claim said so).
pub(super) fn follow(ctx: &Ctx<'_>, before: Scraped, chain: &Hops, spent: bool) -> Guarded {
    let request = Guarded {
        url: before.url,
        prior: before.prior,
        wanted: before.wanted,
        booked: None,
        tries: ctx.delivery.tries(),
        spent,
        redirected: false,
        followed: true,
    };
    resumed(request, Some(chain))
}
