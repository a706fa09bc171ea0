//! robots.txt for the fleet: kept by each sandbox, else the fleet's copy, else fetched once
//! (its own timeout, its first 500 KiB) while the host's other records wait.

use crate::domain::limits::{Host, HostLimits, Millis};
use crate::metrics::Measures;
use crate::ports::error::StoreError;
use crate::ports::hosts::{HostStore, RobotsRecord};
use crate::scraper::{self, Fetcher, health_sign};
use robots::{Parsed, Verdict};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use super::{
    Gate, KeptRobots, MOST_HOSTS, ORDER, Permit, ROBOTS_LEASE_MS, ROBOTS_POLL,
    ROBOTS_SHORT_WAIT_MS, ROBOTS_WAIT, jittered, millis, now_ms, robots,
};

/// What robots.txt lets a record do.
pub(super) enum RobotsSays {
    Fetch {
        crawl_delay: Option<f64>,
    },
    Disallowed,
    Wait(Duration),
    /// Our proxy could not fetch it.
    ProxyFailed,
}

impl Gate {
    /// The host's robots.txt: kept by this sandbox, else the fleet's copy, else fetched once
    /// for the fleet (outside the host's schedule and slots, its cooldown obeyed) while
    /// others wait.
    pub(super) async fn robots<S: HostStore, F: Fetcher>(
        &self,
        (store, fetcher): (&S, &F),
        host: &Host,
        url: &url::Url,
        limits: HostLimits,
        fetch_time: Duration,
        measures: &Measures,
    ) -> Result<RobotsSays, StoreError> {
        let kept = self.kept_robots(host);
        let mut kept = kept.lock().await;
        let now = now_ms();
        if let Some((parsed, until)) = kept.as_ref().filter(|(_, until)| *until > now) {
            return Ok(says(parsed, url).or_until(*until, now));
        }
        let record = match store.robots(host).await?.filter(|r| r.expires_at > now) {
            Some(record) => record,
            None => {
                let fetched =
                    self.fetch_robots((store, fetcher), host, url, limits, fetch_time, measures);
                match fetched.await? {
                    Ok(record) => record,
                    Err(RobotsSays::Wait(wait)) => {
                        // This sandbox's other records of the host wait as long, at once.
                        *kept = Some((Parsed::Unavailable, now_ms() + millis(wait)));
                        return Ok(RobotsSays::Wait(wait));
                    }
                    Err(says) => return Ok(says),
                }
            }
        };
        let parsed = Parsed::of(&record.rules, &self.settings.agent);
        *kept = Some((parsed.clone(), record.expires_at));
        Ok(says(&parsed, url).or_until(record.expires_at, now_ms()))
    }

    /// The fleet's one fetch of a host's robots.txt, stored for every sandbox; or what to
    /// do while another sandbox has it.
    pub(super) async fn fetch_robots<S: HostStore, F: Fetcher>(
        &self,
        (store, fetcher): (&S, &F),
        host: &Host,
        url: &url::Url,
        limits: HostLimits,
        fetch_time: Duration,
        measures: &Measures,
    ) -> Result<Result<RobotsRecord, RobotsSays>, StoreError> {
        let timeout = self.settings.robots_timeout;
        // The cooldown is read before the fleet's lease is taken, so a host cooling down
        // holds no lease for the others to wait out.
        let now = now_ms();
        if let Some(until) = store.host(host).await?.cooldown_until.filter(|u| *u > now) {
            return Ok(Err(RobotsSays::Wait(jittered(until - now))));
        }
        if !store
            .take_robots_fetch(host, now, now + ROBOTS_LEASE_MS)
            .await?
        {
            return self.await_robots(store, host, fetch_time).await;
        }
        // Outside the schedule and the slots: one request a day for the whole fleet, which
        // must not queue behind the starts the host's records have booked. Its push-back
        // still cools the host.
        let permit = Permit {
            host: Some((host.clone(), limits.max_rps)),
            ..Permit::default()
        };
        let started = std::time::Instant::now();
        let fetched = robots_fetched(fetcher, url, fetch_time.min(timeout), measures).await;
        // Cut short by this record's time, not by its own timeout: no answer of the site's.
        // A record with time comes back for it (the lease lapses meanwhile).
        let cut_short = fetch_time < timeout && fetched.as_ref().is_err_and(|e| e.timed_out);
        let sign = health_sign(&fetched, started.elapsed()).filter(|_| !cut_short);
        self.leave(store, permit, sign, measures).await;
        if cut_short {
            return Ok(Err(RobotsSays::Wait(jittered(ROBOTS_SHORT_WAIT_MS))));
        }
        self.keep_robots(store, host, &fetched).await.map(Ok)
    }

    /// The fetched robots.txt (or its failure) kept for the fleet: its rules until they
    /// expire, or how long to wait before it is asked again.
    async fn keep_robots<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        fetched: &Result<crate::domain::model::Page, scraper::FetchError>,
    ) -> Result<RobotsRecord, StoreError> {
        let ttl = millis(self.settings.robots_ttl);
        let retry = millis(self.settings.robots_retry);
        let record = robots::record_of(fetched, now_ms(), (ttl, retry));
        let record = store.put_robots(host, record).await?;
        let rules = record.rules.kind();
        tracing::info!(
            host = host.as_str(),
            rules,
            "robots.txt fetched for the fleet"
        );
        Ok(record)
    }

    /// Another sandbox is fetching the host's robots.txt: its copy is read a few times within
    /// [`ROBOTS_WAIT`] (the fetch takes moments), so the host's first records need not be sent
    /// away to wait; then they wait as copies.
    pub(super) async fn await_robots<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        fetch_time: Duration,
    ) -> Result<Result<RobotsRecord, RobotsSays>, StoreError> {
        let until = tokio::time::Instant::now() + ROBOTS_WAIT.min(fetch_time / 2);
        while tokio::time::Instant::now() + ROBOTS_POLL < until {
            tokio::time::sleep(ROBOTS_POLL).await;
            if let Some(record) = store
                .robots(host)
                .await?
                .filter(|r| r.expires_at > now_ms())
            {
                return Ok(Ok(record));
            }
        }
        Ok(Err(RobotsSays::Wait(jittered(millis(ROBOTS_WAIT)))))
    }

    /// The host's entry, made if it has none.
    pub(super) fn kept_robots(&self, host: &Host) -> Arc<KeptRobots> {
        let mut kept = self.robots.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() >= MOST_HOSTS && !kept.contains_key(host) {
            kept.retain(|_, entry| entry.try_lock().is_err());
        }
        kept.entry(host.clone()).or_default().clone()
    }
}

/// The robots.txt of `url`'s host, its first 500 KiB, within `fetch_time`: metered for the fleet,
/// not charged to a run (one robots.txt serves them all).
async fn robots_fetched<F: Fetcher>(
    fetcher: &F,
    url: &url::Url,
    fetch_time: Duration,
    measures: &Measures,
) -> Result<crate::domain::model::Page, scraper::FetchError> {
    let robots_url = robots::robots_url(url).unwrap_or_default();
    let ask = scraper::Ask {
        keep_first: Some(robots::MAX_ROBOTS_BYTES as u64),
        ..scraper::Ask::within(fetch_time)
    };
    let fetched = fetcher.fetch(&robots_url, ask).await;
    measures.spent(&fetched.spend);
    measures.polite.robots_fetches.fetch_add(1, ORDER);
    fetched.page
}

fn says(parsed: &Parsed, url: &url::Url) -> RobotsSays {
    match parsed.verdict(url.as_str()) {
        Verdict::Allowed { crawl_delay } => RobotsSays::Fetch { crawl_delay },
        Verdict::Disallowed => RobotsSays::Disallowed,
        // How long: `or_until`, from the copy's expiry.
        Verdict::Unavailable => RobotsSays::Wait(Duration::ZERO),
        Verdict::ProxyFailed => RobotsSays::ProxyFailed,
    }
}

impl RobotsSays {
    /// An unavailable robots.txt holds until the fleet's copy expires.
    fn or_until(self, expires_at: Millis, now: Millis) -> Self {
        match self {
            RobotsSays::Wait(_) => {
                RobotsSays::Wait(jittered(expires_at.saturating_sub(now).max(1_000)))
            }
            says => says,
        }
    }
}
