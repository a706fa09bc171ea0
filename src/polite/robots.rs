//! robots.txt (RFC 9309) for one host: what the fleet's fetch of it means, and whether a URL
//! may be fetched under it.

use std::sync::Arc;

use crate::domain::limits::Millis;
use crate::domain::model::Page;
use crate::ports::hosts::{Robots, RobotsRecord};
use crate::scraper::{FetchError, Retry};

pub use crate::domain::limits::MAX_ROBOTS_BYTES;

/// The redirects a robots.txt fetch follows itself, as RFC 9309 asks (at least five). A
/// robots.txt redirect serves every task of its host, so it takes no turn of its own.
pub const ROBOTS_REDIRECTS: usize = 5;

/// A host's robots.txt may use 1 MiB a day on the paid proxy tier
/// (`ROBOTS_PAID_BUDGET_BYTES`): a fetch holds [`ROBOTS_WIRE_MOST`] while it runs, and gives
/// back what it did not spend; most files are far smaller.
pub const ROBOTS_PAID_BUDGET: u64 = 1024 * 1024;

/// The most bytes on the wire a robots.txt fetch may use through a proxy: its first 500 KiB,
/// its redirects and framing. It is also what a fetch on the paid tier holds of its host's
/// budget while it runs.
pub const ROBOTS_WIRE_MOST: u64 = 640 * 1024;

/// robots.txt as a sandbox keeps it: parsed once.
#[derive(Clone)]
pub enum Parsed {
    Rules(Arc<texting_robots::Robot>),
    AllowAll,
    Unavailable,
    ProxyFailed,
}

impl std::fmt::Debug for Parsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Parsed::Rules(_) => "Rules",
            Parsed::AllowAll => "AllowAll",
            Parsed::Unavailable => "Unavailable",
            Parsed::ProxyFailed => "ProxyFailed",
        })
    }
}

/// What robots.txt says of one URL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Fetch it; `Crawl-delay` in seconds if the file sets one for us.
    Allowed {
        crawl_delay: Option<f64>,
    },
    Disallowed,
    /// The host's robots.txt could not be fetched: nothing is fetched from the host for now.
    Unavailable,
    /// Our proxy could not fetch it: nothing is fetched for now. This is our failure.
    ProxyFailed,
}

impl Parsed {
    /// `agent`: the product token of our user-agent (what `User-agent:` lines name).
    pub fn of(robots: &Robots, agent: &str) -> Self {
        match robots {
            // A file the parser refuses is read as no file (RFC 9309: parse what can be).
            Robots::Rules(body) => match texting_robots::Robot::new(agent, body) {
                Ok(robot) => Parsed::Rules(Arc::new(robot)),
                Err(_) => Parsed::AllowAll,
            },
            Robots::AllowAll => Parsed::AllowAll,
            Robots::Unavailable => Parsed::Unavailable,
            Robots::ProxyFailed => Parsed::ProxyFailed,
        }
    }

    pub fn verdict(&self, url: &str) -> Verdict {
        match self {
            Parsed::Rules(robot) if robot.allowed(url) => Verdict::Allowed {
                crawl_delay: robot.delay.map(f64::from),
            },
            Parsed::Rules(_) => Verdict::Disallowed,
            Parsed::AllowAll => Verdict::Allowed { crawl_delay: None },
            Parsed::Unavailable => Verdict::Unavailable,
            Parsed::ProxyFailed => Verdict::ProxyFailed,
        }
    }
}

/// The longest gap before a robots.txt that keeps failing is asked again: an hour.
pub const ROBOTS_MOST_RETRY: Millis = 3_600_000;

/// The record of a robots.txt fetch, after `failed` fetches that failed in a row. A file is
/// obeyed for `ttl`. A 4xx other than 429, or a fetch our own rules refuse, means no rules,
/// for `ttl`. A 429, a 5xx or no answer means nothing is allowed until it is asked again. An
/// answer made by the proxy itself (a 407, a gateway error, a refused CONNECT) is not the
/// site's answer: nothing is known until then, and the records that meet it fail for a
/// reason on our side. A failure is asked again after `retry`, doubled for each failure
/// before it, up to [`ROBOTS_MOST_RETRY`].
pub fn record_of(
    fetched: &Result<Page, FetchError>,
    now: Millis,
    (ttl, retry): (Millis, Millis),
    failed: u32,
) -> RobotsRecord {
    let retry = retry
        .saturating_mul(1 << failed.min(20))
        .min(ROBOTS_MOST_RETRY.max(retry));
    let (rules, lasts) = match fetched {
        Ok(page) => (Robots::Rules(page.body.to_vec()), ttl),
        Err(err) if err.retry == Retry::Ours => (Robots::ProxyFailed, retry),
        Err(err) => match err.http_status {
            Some(status) if (400..500).contains(&status) && status != 429 => {
                (Robots::AllowAll, ttl)
            }
            // Refused for good before any answer (an address that is not public, a file
            // over the cap). The tasks' own fetches hit the same rule and fail by it.
            None if err.retry == Retry::Permanent => (Robots::AllowAll, ttl),
            _ => (Robots::Unavailable, retry),
        },
    };
    let failures = match rules {
        Robots::Unavailable | Robots::ProxyFailed => failed.saturating_add(1),
        Robots::Rules(_) | Robots::AllowAll => 0,
    };
    RobotsRecord {
        rules,
        expires_at: now + lasts,
        failures,
    }
}

/// The robots.txt of a URL's host (scheme, host and port; RFC 9309 2.3).
pub fn robots_url(url: &url::Url) -> Option<String> {
    let host = url.host_str()?;
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    Some(format!("{}://{host}{port}/robots.txt", url.scheme()))
}

/// The product token of a user-agent (`conveyor-worker/0.1 (+https://…)` →
/// `conveyor-worker`): what a robots.txt's `User-agent:` lines match.
pub fn agent_token(user_agent: &str) -> String {
    let token: String = user_agent
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    if token.is_empty() { "*".into() } else { token }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(body: &str) -> Result<Page, FetchError> {
        Ok(Page {
            url: "http://h/robots.txt".into(),
            http_status: 200,
            final_url: "http://h/robots.txt".into(),
            content_type: "text/plain".into(),
            body: body.as_bytes().to_vec().into(),
            validators: Default::default(),
            rendered: None,
            screenshot: None,
        })
    }

    fn status(code: u16) -> Result<Page, FetchError> {
        let mut err = FetchError::permanent(format!("HTTP {code}"));
        err.http_status = Some(code);
        Err(err)
    }

    #[test]
    fn rules_for_our_agent_decide_and_crawl_delay_is_read() {
        let file = "User-agent: conveyor-worker\nDisallow: /private\nCrawl-delay: 2\n\n\
                    User-agent: *\nDisallow: /\n";
        let record = record_of(&page(file), 0, (100, 10), 0);
        let parsed = Parsed::of(&record.rules, "conveyor-worker");

        assert_eq!(parsed.verdict("http://h/private/a"), Verdict::Disallowed);
        assert_eq!(
            parsed.verdict("http://h/public"),
            Verdict::Allowed {
                crawl_delay: Some(2.0)
            }
        );
        assert_eq!(record.expires_at, 100);
    }

    #[test]
    fn a_missing_file_allows_all_and_an_unavailable_one_allows_nothing_until_retry_ours_or_not() {
        let missing = record_of(&status(404), 0, (100, 10), 0);
        let failing = record_of(&status(503), 0, (100, 10), 0);
        let throttled = record_of(&status(429), 0, (100, 10), 0);
        let unreachable = record_of(
            &Err(FetchError::transient("connection refused")),
            0,
            (100, 10),
            0,
        );
        let refused = record_of(
            &Err(FetchError::permanent("address is not public")),
            0,
            (100, 10),
            0,
        );
        let proxy_407 = record_of(
            &Err(FetchError {
                http_status: Some(407),
                ..FetchError::ours("HTTP 407 from the proxy")
            }),
            0,
            (100, 10),
            0,
        );

        assert_eq!(
            (missing.rules.clone(), missing.expires_at),
            (Robots::AllowAll, 100)
        );
        assert_eq!(refused.rules, Robots::AllowAll);
        for record in [failing, throttled, unreachable] {
            assert_eq!((record.rules, record.expires_at), (Robots::Unavailable, 10));
        }
        assert_eq!(
            (proxy_407.rules, proxy_407.expires_at),
            (Robots::ProxyFailed, 10),
            "ours, not the site's"
        );
    }

    #[test]
    fn a_robots_txt_that_keeps_failing_is_asked_again_after_doubling_gaps_up_to_an_hour() {
        // Arrange: a 429 without Retry-After, at every ask, with a minute between asks.
        let minute = 60_000;
        let mut failed = 0;
        let mut gaps = Vec::new();

        // Act: the asks of two days.
        let mut at = 0;
        while at < 48 * 3_600_000 {
            let record = record_of(&status(429), at, (86_400_000, minute), failed);
            gaps.push(record.expires_at - at);
            (at, failed) = (record.expires_at, record.failures);
        }

        // Assert: 1, 2, 4 ... 32 minutes, then an hour each: 53 asks, not 2,880.
        assert_eq!(gaps[..6], [1, 2, 4, 8, 16, 32].map(|m| m * minute));
        assert!(gaps[6..].iter().all(|gap| *gap == ROBOTS_MOST_RETRY));
        assert_eq!(gaps.len(), 53);
        let fetched = record_of(&page("User-agent: *\n"), at, (86_400_000, minute), failed);
        assert_eq!(fetched.failures, 0, "a file ends the run of failures");
    }

    #[test]
    fn the_agent_token_is_the_product_name_and_the_file_sits_at_the_hosts_root() {
        let url = url::Url::parse("https://Example.com:8443/a/b?c").unwrap();

        assert_eq!(
            agent_token("conveyor-worker/0.1 (+https://x)"),
            "conveyor-worker"
        );
        assert_eq!(
            robots_url(&url).as_deref(),
            Some("https://example.com:8443/robots.txt")
        );
    }
}
