//! robots.txt for the whole fleet. Each sandbox keeps its own copy. Without one, it reads
//! the fleet's stored copy. Without that, one sandbox fetches it (with its own timeout, first
//! 500 KiB only) while the host's other records wait.

use crate::domain::limits::{Host, HostLimits, Millis};
use crate::domain::time::rfc3339;
use crate::metrics::Measures;
use crate::ports::error::StoreError;
use crate::ports::hosts::{HostStore, RobotsRecord};
use crate::scraper::{self, Fetcher, health_sign};
use robots::{Parsed, Verdict};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use super::{
    Gate, GatePorts, KeptRobots, MOST_HOSTS, ORDER, Permit, ROBOTS_LEASE_MS, ROBOTS_POLL,
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
    /// The host's robots.txt: this sandbox's copy, else the fleet's stored copy, else fetched
    /// once for the fleet while other records wait. That fetch skips the host's schedule and
    /// slots, but obeys its cooldown.
    pub(super) async fn robots<S: HostStore, F: Fetcher>(
        &self,
        ports: GatePorts<'_, S, F>,
        host: &Host,
        url: &url::Url,
        limits: HostLimits,
        fetch_time: Duration,
        measures: &Measures,
    ) -> Result<RobotsSays, StoreError> {
        let GatePorts { store, .. } = ports;
        let kept = self.kept_robots(host);
        let mut kept = kept.lock().await;
        let now = now_ms();
        if let Some((parsed, until)) = kept.as_ref().filter(|(_, until)| *until > now) {
            return Ok(says(parsed, url).or_until(*until, now));
        }
        let stored = store.robots(host).await?;
        // The fetches that failed in a row so far, for the gap before the next.
        let failed = stored.as_ref().map_or(0, |r| r.failures);
        let record = match stored.filter(|r| r.expires_at > now) {
            Some(record) => record,
            None => {
                let asked = (limits, failed);
                let fetched = self.fetch_robots(ports, host, url, asked, fetch_time, measures);
                match fetched.await? {
                    Ok(record) => record,
                    Err(RobotsSays::Wait(wait)) => {
                        // This sandbox's other records of the host get the same wait at once.
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

    /// The fleet's single fetch of a host's robots.txt, stored for every sandbox, after
    /// `failed` fetches that failed in a row. If another sandbox is already fetching it,
    /// what to do meanwhile.
    #[tracing::instrument(target = "conveyor_step", name = "robots", skip_all)]
    pub(super) async fn fetch_robots<S: HostStore, F: Fetcher>(
        &self,
        ports: GatePorts<'_, S, F>,
        host: &Host,
        url: &url::Url,
        (limits, failed): (HostLimits, u32),
        fetch_time: Duration,
        measures: &Measures,
    ) -> Result<Result<RobotsRecord, RobotsSays>, StoreError> {
        let store = ports.store;
        let timeout = self.settings.robots_timeout;
        // The cooldown is read before the fleet's lease is taken. So a host in cooldown
        // holds no lease that other records must wait out.
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
        // This fetch skips the schedule and the slots. It is one request a day for the whole
        // fleet, and must not queue behind the starts the host's records have booked. A
        // push-back on it still puts the host in cooldown.
        let permit = Permit {
            host: Some((host.clone(), limits.max_rps)),
            ..Permit::default()
        };
        let started = std::time::Instant::now();
        let time = fetch_time.min(timeout);
        let fetched = self
            .robots_fetched(ports, (host, url), time, measures)
            .await;
        // A fetch cut short by this record's time, not by the robots.txt timeout, says
        // nothing about the site. A record with enough time comes back for it; the lease
        // expires meanwhile.
        let cut_short = fetch_time < timeout && fetched.as_ref().is_err_and(|e| e.timed_out);
        let sign = health_sign(&fetched, started.elapsed()).filter(|_| !cut_short);
        self.schedule.leave(store, permit, sign, measures).await;
        if cut_short {
            return Ok(Err(RobotsSays::Wait(jittered(ROBOTS_SHORT_WAIT_MS))));
        }
        self.keep_robots(store, host, &fetched, failed)
            .await
            .map(Ok)
    }

    /// Stores the fetched robots.txt, or its failure, for the fleet: its rules until they
    /// expire, or how long to wait before it is fetched again.
    async fn keep_robots<S: HostStore>(
        &self,
        store: &S,
        host: &Host,
        fetched: &Result<crate::domain::model::Page, scraper::FetchError>,
        failed: u32,
    ) -> Result<RobotsRecord, StoreError> {
        let ttl = millis(self.settings.robots_ttl);
        let retry = millis(self.settings.robots_retry);
        let record = robots::record_of(fetched, now_ms(), (ttl, retry), failed);
        let record = store.put_robots(host, record).await?;
        let rules = record.rules.kind();
        tracing::info!(
            host = host.as_str(),
            rules,
            "robots.txt fetched for the fleet"
        );
        Ok(record)
    }

    /// Another sandbox is fetching the host's robots.txt. The fleet's copy is read a few
    /// times within [`ROBOTS_WAIT`], since the fetch is quick. So the host's first records
    /// need not be sent away to wait. After that, they wait as parked copies.
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

impl Gate {
    /// Fetches the robots.txt of `url`'s host (first 500 KiB only) within `fetch_time`,
    /// as a page is fetched: the free proxy tiers first, each fetch capped on the wire. The
    /// paid tier gets it only within the host's robots.txt budget for the day
    /// (`ROBOTS_PAID_BUDGET_BYTES`), held while it runs and settled with what it spent. One
    /// robots.txt serves every run, so its spend is the fleet's, in the metrics and on the
    /// host (`conveyor-ops host show`), not a run's.
    async fn robots_fetched<S: HostStore, F: Fetcher>(
        &self,
        ports: GatePorts<'_, S, F>,
        (host, url): (&Host, &url::Url),
        fetch_time: Duration,
        measures: &Measures,
    ) -> Result<crate::domain::model::Page, scraper::FetchError> {
        let robots_url = robots::robots_url(url).unwrap_or_default();
        let paid = self.settings.robots_paid;
        let ask = scraper::Ask {
            keep_first: Some(robots::MAX_ROBOTS_BYTES as u64),
            redirects: robots::ROBOTS_REDIRECTS,
            paid_tier: paid.tier == 0,
            wire_most: Some(robots::ROBOTS_WIRE_MOST),
            ..scraper::Ask::within(fetch_time)
        };
        let started = tokio::time::Instant::now();
        let mut fetched = ports.fetcher.fetch(&robots_url, ask).await;
        measures.polite.robots_fetches.fetch_add(1, ORDER);
        if fetched.wants_paid_tier {
            let ask = scraper::Ask {
                first_tier: paid.tier,
                paid_tier: true,
                time: fetch_time.saturating_sub(started.elapsed()),
                ..ask
            };
            let first = fetched.spend;
            let paid = self.robots_paid(ports, host, (&robots_url, ask), measures);
            fetched = paid.await.unwrap_or(fetched);
            fetched.spend = first.plus(&fetched.spend);
        }
        measures.spent(&fetched.spend);
        fetched.page
    }

    /// The paid tier's fetch of a robots.txt, if the host's budget for the day has room for
    /// its hold. `None` when it has not, or the budget could not be read.
    async fn robots_paid<S: HostStore, F: Fetcher>(
        &self,
        ports: GatePorts<'_, S, F>,
        host: &Host,
        (robots_url, ask): (&str, scraper::Ask<'_>),
        measures: &Measures,
    ) -> Option<scraper::Fetched> {
        let (hold, budget) = (robots::ROBOTS_WIRE_MOST, self.settings.robots_paid.budget);
        let day = rfc3339(std::time::SystemTime::now())[..10].to_owned();
        match ports
            .store
            .hold_robots_paid(host, &day, (hold, budget))
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(
                    budget,
                    "the host's robots.txt budget on the paid tier is spent today"
                );
                return None;
            }
            Err(err) => {
                tracing::warn!(error = %err, "the host's robots.txt budget could not be read");
                return None;
            }
        }
        let fetched = ports.fetcher.fetch(robots_url, ask).await;
        let spent = fetched.spend.tier(ask.first_tier).billed();
        measures.polite.robots_paid_bytes.fetch_add(spent, ORDER);
        let settled = ports.store.settle_robots_paid(host, &day, (hold, spent));
        if let Err(err) = settled.await {
            tracing::warn!(error = %err, spent, "the paid robots.txt fetch's spend could not be settled");
        }
        Some(fetched)
    }
}

fn says(parsed: &Parsed, url: &url::Url) -> RobotsSays {
    match parsed.verdict(url.as_str()) {
        Verdict::Allowed { crawl_delay } => RobotsSays::Fetch { crawl_delay },
        Verdict::Disallowed => RobotsSays::Disallowed,
        // `or_until` sets how long, from the copy's expiry.
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
