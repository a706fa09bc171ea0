//! What a fetch is asked for (`Ask`), what it returns (`Fetched`), and the `Fetcher` port
//! the worker fetches through (`HttpFetcher` in production, a fake in tests).

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use url::Url;

use crate::domain::blocks::{Detection, TABLE_ONLY};
use crate::domain::model::Page;
use crate::domain::refresh::Validators;
use crate::domain::render::RenderOptions;
use crate::domain::spend::Spend;

use super::FetchError;

/// What a fetch may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// The most time the fetch may take.
    pub time: Duration,
    /// The proxy tier to start from (1-based).
    pub first_tier: usize,
    /// Whether the last (paid) proxy tier may be used: held back while a run has a budget
    /// for it, until the other tiers are blocked and the budget has room.
    pub paid_tier: bool,
    /// Keep the body's first this many bytes and stop reading (robots.txt), instead of
    /// refusing a body over `MAX_BODY_BYTES`.
    pub keep_first: Option<u64>,
    /// Ask only for a page changed since the response these validators came from
    /// (`If-None-Match`, `If-Modified-Since`). A `304 Not Modified` then counts as a page.
    pub if_changed: Option<&'a Validators>,
    /// How answers are checked for block and challenge pages (the job's choice).
    pub detection: &'a Detection,
    /// The most bytes on the wire the fetch may use through a proxy (a paid fetch's hold).
    /// The proxy's relay cuts the connection there, and the fetch fails as a page too large.
    pub wire_most: Option<u64>,
    /// How many redirects the fetcher follows itself (robots.txt's, up to
    /// `MAX_REDIRECTS`). A page's are none: a redirect past them ends the fetch with
    /// [`FetchError::moved_to`], and the worker takes the target host's turn for the next.
    pub redirects: usize,
    /// The job's rendering options, for a fetcher that renders (the renderer's browser).
    pub render: Option<&'a RenderOptions>,
}

impl Ask<'_> {
    /// Every tier, within `time`.
    pub fn within(time: Duration) -> Self {
        Self {
            time,
            first_tier: 1,
            paid_tier: true,
            keep_first: None,
            if_changed: None,
            wire_most: None,
            detection: &TABLE_ONLY,
            redirects: 0,
            render: None,
        }
    }
}

/// A fetch's page or failure, and what it spent through proxies on the way.
#[derive(Debug)]
pub struct Fetched {
    pub page: Result<Page, FetchError>,
    pub spend: Spend,
    /// The tiers asked were blocked (or the paid tier is the only one), and the paid tier
    /// was held back. Only the paid tier may still get the page.
    pub wants_paid_tier: bool,
}

impl Fetched {
    /// A fetch that sent nothing through a proxy.
    pub fn unspent(page: Result<Page, FetchError>) -> Self {
        Self {
            page,
            spend: Spend::default(),
            wants_paid_tier: false,
        }
    }
}

/// Fetches pages.
pub trait Fetcher: Send + Sync {
    /// Fetches `url` as `ask` allows.
    fn fetch(&self, url: &str, ask: Ask<'_>) -> impl Future<Output = Fetched> + Send;

    /// Why `url` is refused before anything is sent or resolved (its length, syntax,
    /// scheme, credentials, port, or a literal address), if it is. This is checked before
    /// the host's turn is taken.
    fn refuses(&self, _url: &str) -> Option<FetchError> {
        None
    }

    /// The address `url`'s host resolves to, for politeness keyed by address. It is the
    /// lowest of the name's addresses, so the key does not change when DNS rotates them. It
    /// is given only if every one of them may be reached; `None` if it cannot be told.
    fn address_of(&self, _url: &Url) -> impl Future<Output = Option<IpAddr>> + Send {
        async { None }
    }

    /// What this fetcher counted of its own since it was last asked, as metrics: (name,
    /// unit, value). The renderer's browser has some; the HTTP fetcher none.
    fn take_measures(&self) -> Vec<OwnMeasure> {
        Vec::new()
    }
}

/// A metric a fetcher counts of its own: its name, its EMF unit, and its value.
pub type OwnMeasure = (&'static str, &'static str, u64);
