//! A host's shared limits, as pure arithmetic. The rate limit is a schedule of start times
//! (GCRA): each fetch reserves the next start, one interval after the last. In-flight slots
//! are held with leases that expire by themselves. A cooldown follows when the host pushed
//! back.

use crate::domain::ids::Id;

/// Milliseconds since the Unix epoch: the one clock every sandbox shares.
pub type Millis = u64;

/// The key a host's politeness state is kept under: its schedule, slots, cooldown and
/// health. By default the key is the host's name and port (`example.com:443`), the same
/// however the URL spells them. The name is lower-case and IDNA-encoded (`url` does both),
/// without the root's trailing dot. The port is always written, even the scheme's default.
/// A job may instead key by the registrable domain (`domain:example.co.uk`) or by the
/// address the name resolves to (`address:192.0.2.1`). Then the many sites of one shared
/// host share one schedule. The key is at most 260 bytes (a DNS name is at most 253), so
/// it is safe inside an item's key. The prefixes keep the kinds apart, since a host key
/// always ends in its port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Host(String);

/// What a job keys its politeness by (`politeness_key` on the job item).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PoliteKey {
    /// The host and port (the default).
    #[default]
    Host,
    /// The registrable domain (the Public Suffix List's eTLD+1): `a.example.com` and
    /// `b.example.com` share one schedule.
    Domain,
    /// The address the host's name resolves to. All sites on one shared host share one.
    Address,
}

impl PoliteKey {
    /// The job item's spelling. `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "host" => Some(Self::Host),
            "domain" => Some(Self::Domain),
            "address" => Some(Self::Address),
            _ => None,
        }
    }
}

impl Host {
    /// The host of an absolute http(s) URL. `None` for anything else.
    pub fn of(url: &url::Url) -> Option<Self> {
        let name = match url.host()? {
            // `example.com.` names `example.com` (the trailing dot is the DNS root's).
            url::Host::Domain(name) => {
                let bare = name.strip_suffix('.').filter(|bare| !bare.is_empty());
                bare.unwrap_or(name).to_ascii_lowercase()
            }
            _ => url.host_str()?.to_owned(),
        };
        let port = url.port_or_known_default()?;
        let host = format!("{name}:{port}");
        (host.len() <= 260).then_some(Self(host))
    }

    /// The registrable domain of a URL's host, by the Public Suffix List, whatever the port
    /// and scheme. `None` for an address, or a name without one (`localhost`, a bare suffix).
    pub fn domain_of(url: &url::Url) -> Option<Self> {
        let url::Host::Domain(name) = url.host()? else {
            return None;
        };
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        let domain = psl::domain_str(&name)?;
        let key = format!("domain:{domain}");
        (key.len() <= 260).then_some(Self(key))
    }

    /// The key of an address a host's name resolves to.
    pub fn address(ip: std::net::IpAddr) -> Self {
        Self(format!("address:{ip}"))
    }

    /// The host a URL or a key names, as the worker keys it. A URL is keyed by
    /// [`Host::of`]. A key is `name:port`, `domain:<domain>` or `address:<ip>`, spelled in
    /// any case. The error says what is wrong.
    pub fn parse_key(text: &str) -> Result<Self, &'static str> {
        if text.contains("://") {
            let url = url::Url::parse(text).map_err(|_| "not a URL")?;
            return Self::of(&url).ok_or("not an http(s) URL with a host");
        }
        if let Some(ip) = text.strip_prefix("address:") {
            let ip = ip
                .parse()
                .map_err(|_| "not an IP address after `address:`")?;
            return Ok(Self::address(ip));
        }
        if let Some(domain) = text.strip_prefix("domain:") {
            let url = url::Url::parse(&format!("http://{domain}/")).map_err(|_| "not a domain")?;
            let key = Self::domain_of(&url).ok_or("not a registrable domain")?;
            return match key.0 == format!("domain:{}", domain.to_ascii_lowercase()) {
                true => Ok(key),
                false => Err("not a registrable domain (a subdomain, or a suffix)"),
            };
        }
        let port = text.rsplit_once(':').map(|(_, port)| port);
        if port.is_none_or(|p| p.parse::<u16>().is_err()) {
            return Err("no port: write `name:port` (example.com:443), or give a URL");
        }
        let url = url::Url::parse(&format!("http://{text}/")).map_err(|_| "not `name:port`")?;
        Self::of(&url).ok_or("not `name:port`")
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A job's own politeness settings: its item's `host_max_rps`, `host_max_inflight`,
/// `obey_robots` and `politeness_key` (data contract v2). A limit of 0 means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JobPoliteness {
    pub max_rps: Option<f64>,
    pub max_inflight: Option<u32>,
    pub obey_robots: Option<bool>,
    pub key: PoliteKey,
}

impl JobPoliteness {
    /// A job's limits as stored. Each is kept only when it is in range: at most 10,000 a
    /// second, and at most [`MAX_SLOTS`] in flight. Otherwise the fleet's setting applies.
    /// The second value says whether a limit was dropped.
    pub fn in_range(
        max_rps: Option<f64>,
        max_inflight: Option<u32>,
        obey_robots: Option<bool>,
    ) -> (Self, bool) {
        let politeness = Self {
            max_rps: max_rps.filter(|r| (0.0..=10_000.0).contains(r)),
            max_inflight: max_inflight.filter(|n| *n <= MAX_SLOTS),
            obey_robots,
            key: PoliteKey::Host,
        };
        let dropped = politeness.max_rps != max_rps || politeness.max_inflight != max_inflight;
        (politeness, dropped)
    }
}

/// The most in-flight slots a host item keeps. `HOST_MAX_INFLIGHT` is at most this.
pub const MAX_SLOTS: u32 = 64;

/// How much of a robots.txt is read and parsed. RFC 9309 (2.5) asks parsers to read at
/// least 500 KiB. The rest of a longer file is not fetched.
pub const MAX_ROBOTS_BYTES: usize = 500 * 1024;

/// How hard the fleet may press one host. `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLimits {
    pub max_rps: Option<f64>,
    pub max_inflight: Option<u32>,
}

impl HostLimits {
    pub fn none() -> Self {
        Self {
            max_rps: None,
            max_inflight: None,
        }
    }

    pub fn is_none(&self) -> bool {
        self.max_rps.is_none() && self.max_inflight.is_none()
    }

    /// Applies robots.txt's `Crawl-delay` (in seconds). Its rate becomes the host's rate if
    /// it is lower.
    pub fn with_crawl_delay(self, delay_s: Option<f64>) -> Self {
        let Some(delay) = delay_s.filter(|d| *d > 0.0) else {
            return self;
        };
        let rate = 1.0 / delay.min(MAX_CRAWL_DELAY_S);
        Self {
            max_rps: Some(self.max_rps.map_or(rate, |r| r.min(rate))),
            ..self
        }
    }
}

/// A `Crawl-delay` past this is taken as this (one fetch a minute).
const MAX_CRAWL_DELAY_S: f64 = 60.0;
/// The largest slowdown after trouble, and its half-life (how fast it wears off).
pub const MAX_SLOWDOWN: f64 = 64.0;
pub const SLOWDOWN_HALF_LIFE_MS: f64 = 60_000.0;
/// The knee is the pace at which a push-back or slow answers hit. With a knee, the slowdown
/// wears off fast down to it, then slowly past it. So the fleet comes back near the site's
/// limit in seconds, and probes beyond it over minutes, as TCP CUBIC grows its window.
pub const TO_KNEE_HALF_LIFE_MS: f64 = 20_000.0;
pub const PAST_KNEE_HALF_LIFE_MS: f64 = 240_000.0;
/// A failing site's cooldown lasts at least this long. The cooldown after a push-back
/// without `Retry-After` is one slowed interval.
pub const MIN_COOLDOWN_MS: Millis = 1_000;
/// A site's `Retry-After` longer than this (a day) is cut to this, for the host's cooldown
/// and for a task's hold.
pub const MAX_RETRY_AFTER_MS: Millis = 24 * 3_600_000;

/// A host's shared state, as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostState {
    /// The earliest start of the next fetch (the theoretical arrival time).
    pub next_start: Option<Millis>,
    /// In-flight slot `i` is held until this time. A crashed holder's slot expires by itself.
    pub slots: Vec<Option<Millis>>,
    /// No fetch starts before this.
    pub cooldown_until: Option<Millis>,
    /// The slowdown factor set by the host's last trouble, and when (`domain::health`).
    pub slowdown: Option<(f64, Millis)>,
    /// The site's knee: the slowdown at which the last push-back or slow answers hit, if
    /// they set the last slowdown.
    pub knee: Option<f64>,
    /// The fleet's average answer time for the host, and its floor, in ms. Every fetch that
    /// gave its slot back counts.
    pub answers: Option<(f64, f64)>,
    /// The length of the last cooldown set without `Retry-After`.
    pub cooldown_ms: Option<Millis>,
    /// Until then the site is failing: one fetch at a time (see [`Trouble`]'s field of that
    /// name). An answer ends it.
    ///
    /// [`Trouble`]: crate::domain::health::Trouble
    pub failing_until: Option<Millis>,
    /// The run whose bookings end the schedule, and where its unbroken stretch of them
    /// began (see [`Tail`]).
    pub tail: Option<Tail>,
    /// The stretch of the schedule last given back by a run that no longer wants work: from
    /// which start, and when. A start in it booked before then is void.
    pub given_back: Option<(Millis, Millis)>,
}

impl HostState {
    /// The slowdown in force at `now`, never under 1. It halves every half-life. With a
    /// knee, it wears off fast down to the knee, then slowly past it.
    pub fn slowdown_at(&self, now: Millis) -> f64 {
        let Some((factor, at)) = self.slowdown else {
            return 1.0;
        };
        let age = now.saturating_sub(at) as f64;
        let worn = |from: f64, age: f64, half_life: f64| from * 0.5_f64.powf(age / half_life);
        let slowdown = match self.knee.filter(|knee| *knee < factor) {
            None => worn(factor, age, SLOWDOWN_HALF_LIFE_MS),
            Some(knee) => {
                let to_knee = TO_KNEE_HALF_LIFE_MS * (factor / knee).log2();
                if age <= to_knee {
                    worn(factor, age, TO_KNEE_HALF_LIFE_MS)
                } else {
                    worn(knee, age - to_knee, PAST_KNEE_HALF_LIFE_MS)
                }
            }
        };
        slowdown.max(1.0)
    }

    /// The fleet's average answer time for the host, if it has one.
    pub fn usual_answer(&self) -> Option<std::time::Duration> {
        let (mean, _) = self.answers?;
        Some(std::time::Duration::from_millis(mean.max(0.0) as u64))
    }

    /// When slot `i` is held until (0: free).
    pub fn slot_until(&self, i: usize) -> Millis {
        self.slots.get(i).copied().flatten().unwrap_or(0)
    }

    /// Whether slot `i` is held at `now` (a lapsed one is free).
    pub fn slot_taken(&self, i: usize, now: Millis) -> bool {
        self.slot_until(i) > now
    }

    /// Whether the site is failing at `now` and one of its first `slots` slots is held: its
    /// one probe is out, so no other fetch starts.
    pub fn probing(&self, now: Millis, slots: u32) -> bool {
        self.failing_until.is_some_and(|until| until > now)
            && (0..slots as usize).any(|i| self.slot_taken(i, now))
    }

    /// Whether a start booked at `booked_at` lies in a stretch given back since. Its run
    /// stopped wanting work (a paused job, say), and the stretch went to other tasks, so the
    /// start is void and the schedule is asked again.
    pub fn gave_back(&self, start: Millis, booked_at: Millis) -> bool {
        self.given_back
            .is_some_and(|(from, at)| start >= from && booked_at < at)
    }

    /// The stretch at the end of the schedule that a run which no longer wants work could
    /// give back, if the schedule runs more than `past` ahead of `now`: its run, and where
    /// the schedule would end without it. `None` when the end is near, or another release's
    /// bookings (or a drop of pace) followed the stretch.
    pub fn reclaimable(&self, now: Millis, past: Millis) -> Option<(&Tail, Millis)> {
        let next = self.next_start?;
        let tail = self.tail.as_ref()?;
        let unbroken = tail.until == next && tail.from < next;
        (unbroken && next > now.saturating_add(past)).then_some((tail, tail.from.max(now)))
    }
}

/// The run a booking is for: its job's and run's ids, kept on the host's item as
/// `<job_id>/<run_id>` (an id never holds a `/`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Booker {
    pub job_id: Id,
    pub run_id: Id,
}

impl Booker {
    /// The booker as the host's item keeps it. `None` for text no booker has.
    pub fn parse(text: &str) -> Option<Self> {
        let (job, run) = text.split_once('/')?;
        Some(Self {
            job_id: Id::parse(job).ok()?,
            run_id: Id::parse(run).ok()?,
        })
    }
}

impl std::fmt::Display for Booker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.job_id, self.run_id)
    }
}

/// The end of a host's schedule: one run's unbroken stretch of bookings, from the start
/// `from` to `until`, where the schedule's next start stood after its last booking. If that
/// run stops wanting work, its stretch is given back, so its booked copies (which will only
/// be acked) do not hold up the tasks of other runs. A stretch is unbroken while nothing
/// else moved the next start: no other run booked, no drop of pace restarted the schedule,
/// and no release that does not keep the tail booked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tail {
    pub run: Booker,
    pub from: Millis,
    pub until: Millis,
}

/// The tail after `booker` took the start `start` and the schedule's next start became
/// `next`: its stretch goes on if it already ended the schedule, or begins at `start`.
pub fn tail_after(state: &HostState, booker: &Booker, start: Millis, next: Millis) -> Tail {
    let from = match &state.tail {
        Some(tail) if tail.run == *booker && Some(tail.until) == state.next_start => tail.from,
        _ => start,
    };
    Tail {
        run: booker.clone(),
        from,
        until: next,
    }
}

/// What one fetch asks of a host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ask {
    pub now: Millis,
    /// Its interval: 1 / rate, times the slowdown in force. `None` means no rate limit.
    pub interval: Option<Millis>,
    /// The latest start it will wait for (it sleeps until its start).
    pub horizon: Millis,
    /// The slot it takes, and until when. `None` means no in-flight limit.
    pub slot: Option<Slot>,
    /// The host's number of slots for this fetch: its in-flight limit, or 0 for none.
    pub slots: u32,
}

/// One of a host's in-flight slots, as a fetch holds it: which one, and until when (ms since
/// the epoch). A holder that crashed loses it then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub index: usize,
    pub until: Millis,
}

impl Slot {
    pub fn new(index: usize, until: Millis) -> Self {
        Self { index, until }
    }
}

impl Ask {
    /// The same ask for a slot free in `state`, if its own is taken and another is free.
    pub fn repicked(&self, state: &HostState) -> Self {
        let Some(Slot { index: slot, until }) = self.slot else {
            return *self;
        };
        let taken = |i: usize| state.slot_taken(i, self.now);
        if !taken(slot) {
            return *self;
        }
        let free = (0..self.slots as usize).find(|&i| !taken(i));
        Self {
            slot: Some(Slot::new(free.unwrap_or(slot), until)),
            ..*self
        }
    }
}

/// The answer to an [`Ask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Start at this time (now or within the horizon).
    StartAt(Millis),
    /// The schedule's next start is this, past the horizon. Nothing was taken.
    Later(Millis),
    /// Not now: the host is cooling down, or the slot is taken. Ask again after about this
    /// long.
    Wait(Millis),
}

/// The interval between starts at `max_rps` with a slowdown.
pub fn interval(max_rps: Option<f64>, slowdown: f64) -> Option<Millis> {
    max_rps.map(|rps| ((1_000.0 / rps) * slowdown).ceil().max(1.0) as Millis)
}

/// The schedule's answer, and the state after it. This is the rule that the DynamoDB
/// conditions encode.
pub fn decide(state: &HostState, ask: &Ask) -> (Grant, HostState) {
    let now = ask.now;
    if let Some(until) = state.cooldown_until.filter(|u| *u > now) {
        return (Grant::Wait(until - now), state.clone());
    }
    if let Some(Slot { index: slot, .. }) = ask.slot
        && (state.slot_taken(slot, now) || state.probing(now, ask.slots))
    {
        return (Grant::Wait(SLOT_RETRY_MS), state.clone());
    }
    // Without a rate the schedule does not apply, and only a slot is asked for. A booked
    // start, too, takes only its slot, whatever is booked after it.
    let start = match ask.interval {
        Some(_) => state.next_start.map_or(now, |next| next.max(now)),
        None => now,
    };
    if start > ask.horizon {
        return (Grant::Later(start), state.clone());
    }
    let mut after = state.clone();
    if let Some(interval) = ask.interval {
        after.next_start = Some(start + interval);
    }
    if let Some(Slot { index: slot, until }) = ask.slot {
        if after.slots.len() <= slot {
            after.slots.resize(slot + 1, None);
        }
        after.slots[slot] = Some(until);
    }
    (Grant::StartAt(start), after)
}

impl Grant {
    /// A grant the host kept refusing under contention becomes a short wait.
    pub fn waiting(self) -> Self {
        match self {
            Grant::StartAt(_) => Grant::Wait(CONTENDED_RETRY_MS),
            wait => wait,
        }
    }
}

/// How long a fetch waits before it asks again, after others beat it to the host's schedule
/// twice.
pub const CONTENDED_RETRY_MS: Millis = 250;

/// How long a fetch that found every slot taken waits before it asks again.
pub const SLOT_RETRY_MS: Millis = 1_000;

#[cfg(test)]
mod tests {
    use super::*;

    fn booker(run: &str) -> Booker {
        Booker::parse(&format!("job/{run}")).expect("ids")
    }

    #[test]
    fn a_runs_unbroken_bookings_make_the_tail_and_another_runs_begin_a_new_one() {
        // Arrange: run a booked 1 000..3 000; the schedule's next start is 3 000.
        let state = HostState {
            next_start: Some(3_000),
            tail: Some(Tail {
                run: booker("a"),
                from: 1_000,
                until: 3_000,
            }),
            ..HostState::default()
        };
        let restarted = HostState {
            next_start: Some(5_000),
            ..state.clone()
        };

        // Act
        let same = tail_after(&state, &booker("a"), 3_000, 3_500);
        let other = tail_after(&state, &booker("b"), 3_000, 3_500);
        let broken = tail_after(&restarted, &booker("a"), 5_000, 5_500);

        // Assert
        assert_eq!((same.from, same.until), (1_000, 3_500));
        assert_eq!((other.run.clone(), other.from), (booker("b"), 3_000));
        assert_eq!(broken.from, 5_000, "something else moved the next start");
    }

    #[test]
    fn a_failing_site_gets_one_fetch_at_a_time_until_an_answer() {
        // Arrange: a site failing until 10 000 with slot 3 of 8 held until 5 000.
        let failing = HostState {
            failing_until: Some(10_000),
            slots: vec![None, None, None, Some(5_000)],
            ..HostState::default()
        };
        let ask = |now| Ask {
            now,
            interval: None,
            horizon: now,
            slot: Some(Slot::new(0, now + 1_000)),
            slots: 8,
        };

        // Act
        let (probe_out, _) = decide(&failing, &ask(2_000));
        let (probe_back, _) = decide(&failing, &ask(6_000));
        let (healthy, _) = decide(
            &HostState {
                failing_until: None,
                ..failing.clone()
            },
            &ask(2_000),
        );

        // Assert
        assert_eq!(probe_out, Grant::Wait(SLOT_RETRY_MS), "one probe is out");
        assert_eq!(probe_back, Grant::StartAt(6_000), "the probe's slot lapsed");
        assert_eq!(healthy, Grant::StartAt(2_000), "a free slot of 8");
    }

    #[test]
    fn only_an_unbroken_tail_far_enough_ahead_can_be_given_back_and_voids_what_it_held() {
        // Arrange
        let tail = Tail {
            run: booker("a"),
            from: 1_000,
            until: 80_000,
        };
        let state = HostState {
            next_start: Some(80_000),
            tail: Some(tail.clone()),
            ..HostState::default()
        };
        let moved_on = HostState {
            next_start: Some(81_000),
            ..state.clone()
        };
        let given = HostState {
            given_back: Some((10_000, 10_000)),
            ..HostState::default()
        };

        // Act / Assert
        assert_eq!(state.reclaimable(10_000, 10_000), Some((&tail, 10_000)));
        assert_eq!(state.reclaimable(500, 10_000), Some((&tail, 1_000)));
        assert_eq!(state.reclaimable(75_000, 10_000), None, "its end is near");
        assert_eq!(
            moved_on.reclaimable(10_000, 10_000),
            None,
            "others booked after it"
        );
        assert!(
            given.gave_back(20_000, 9_000),
            "booked before, in the stretch"
        );
        assert!(
            !given.gave_back(20_000, 10_500),
            "booked after it was given back"
        );
        assert!(!given.gave_back(9_000, 5_000), "before the stretch");
        assert_eq!(booker("a").to_string(), "job/a");
        assert_eq!(Booker::parse("no-slash"), None);
    }

    fn host(url: &str) -> Option<String> {
        let url = url::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        Host::of(&url).map(|h| h.as_str().to_owned())
    }

    #[test]
    fn a_host_is_one_key_however_its_name_and_port_are_spelled() {
        let spellings = [
            ("http://example.com/a", "example.com:80"),
            ("http://example.com./a", "example.com:80"),
            ("http://EXAMPLE.Com/a", "example.com:80"),
            ("http://Example.COM./a", "example.com:80"),
            ("http://example.com:80/a", "example.com:80"),
            ("http://example.com.:80/a", "example.com:80"),
            ("https://example.com/a", "example.com:443"),
            ("https://example.com:443/a", "example.com:443"),
            ("https://example.com.:443/a", "example.com:443"),
            ("https://example.com:8443/a", "example.com:8443"),
            ("http://bücher.example/a", "xn--bcher-kva.example:80"),
            ("http://BÜCHER.example./a", "xn--bcher-kva.example:80"),
            ("http://xn--bcher-kva.example/a", "xn--bcher-kva.example:80"),
            ("http://127.0.0.1:80/a", "127.0.0.1:80"),
            ("http://[::1]/a", "[::1]:80"),
        ];
        for (url, key) in spellings {
            assert_eq!(host(url).as_deref(), Some(key), "{url}");
        }
    }

    #[test]
    fn a_registrable_domain_keys_every_subdomain_port_and_scheme_of_a_site_alike() {
        let domain = |url: &str| {
            let url = url::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            Host::domain_of(&url).map(|h| h.as_str().to_owned())
        };

        for url in [
            "http://a.example.co.uk/x",
            "https://B.Example.co.uk.:8443/y",
        ] {
            assert_eq!(
                domain(url).as_deref(),
                Some("domain:example.co.uk"),
                "{url}"
            );
        }
        assert_eq!(
            domain("https://user1.github.io/").as_deref(),
            Some("domain:user1.github.io")
        );
        assert_eq!(
            domain("http://127.0.0.1/"),
            None,
            "an address has no domain"
        );
        assert_eq!(domain("http://co.uk/"), None, "a bare suffix has none");
        assert_eq!(
            Host::address("192.0.2.1".parse().expect("an address")).as_str(),
            "address:192.0.2.1"
        );
        assert_eq!(PoliteKey::parse("domain"), Some(PoliteKey::Domain));
        assert_eq!(PoliteKey::parse("Domain"), None);
    }

    #[test]
    fn an_operators_url_or_key_names_the_host_as_the_worker_keys_it() {
        let keyed = |text: &str| Host::parse_key(text).map(|h| h.0);

        assert_eq!(
            keyed("https://Example.com./a?b").as_deref(),
            Ok("example.com:443")
        );
        assert_eq!(keyed("example.com:443").as_deref(), Ok("example.com:443"));
        assert_eq!(keyed("EXAMPLE.com:80").as_deref(), Ok("example.com:80"));
        assert_eq!(keyed("[::1]:8080").as_deref(), Ok("[::1]:8080"));
        assert_eq!(
            keyed("domain:Example.co.uk").as_deref(),
            Ok("domain:example.co.uk")
        );
        assert_eq!(
            keyed("address:192.0.2.1").as_deref(),
            Ok("address:192.0.2.1")
        );
        assert!(keyed("example.com").is_err(), "no port");
        assert!(keyed("[::1]").is_err(), "no port");
        assert!(keyed("domain:a.example.com").is_err(), "a subdomain");
        assert!(keyed("address:example.com").is_err());
        assert!(keyed("mailto:a@example.com").is_err());
    }

    #[test]
    fn a_host_key_is_bounded_and_only_for_http_urls_with_a_host() {
        let long = format!("http://{}.example/", "a".repeat(300));

        assert_eq!(host(&long), None, "over 260 bytes");
        assert_eq!(
            host("http://./a").as_deref(),
            Some(".:80"),
            "the root alone"
        );
        assert_eq!(host("mailto:someone@example.com"), None);
    }

    #[test]
    fn a_jobs_limits_out_of_range_give_way_to_the_fleets() {
        let (kept, dropped) = JobPoliteness::in_range(Some(2.0), Some(4), Some(false));
        assert_eq!(
            (kept.max_rps, kept.max_inflight, kept.obey_robots),
            (Some(2.0), Some(4), Some(false))
        );
        assert!(!dropped);

        let (kept, dropped) = JobPoliteness::in_range(Some(-1.0), Some(MAX_SLOTS + 1), None);
        assert_eq!((kept.max_rps, kept.max_inflight), (None, None));
        assert!(dropped);
    }

    fn ask(now: Millis, interval: Millis, horizon: Millis) -> Ask {
        Ask {
            now,
            interval: Some(interval),
            horizon: now + horizon,
            slot: None,
            slots: 0,
        }
    }

    #[test]
    fn starts_are_one_interval_apart_so_any_second_holds_at_most_rate_plus_one() {
        let mut state = HostState::default();
        let mut starts = Vec::new();

        // 40 fetches asking every 10 ms at 5 a second, each willing to wait 10 s.
        for i in 0..40 {
            let (grant, after) = decide(&state, &ask(i * 10, 200, 10_000));
            state = after;
            if let Grant::StartAt(at) = grant {
                starts.push(at);
            }
        }

        assert_eq!(starts.len(), 40);
        for window in 0..8_000 {
            let inside = starts
                .iter()
                .filter(|s| (window..=window + 1_000).contains(*s))
                .count();
            assert!(
                inside <= 6,
                "{inside} starts in [{window}, {}]",
                window + 1_000
            );
        }
    }

    #[test]
    fn past_the_horizon_a_fetch_waits_until_its_turn_and_reserves_nothing() {
        let state = HostState {
            next_start: Some(5_000),
            ..HostState::default()
        };

        let (grant, after) = decide(&state, &ask(1_000, 200, 1_000));

        assert_eq!(grant, Grant::Later(5_000));
        assert_eq!(after, state);
    }

    #[test]
    fn an_idle_host_starts_now_and_a_cooldown_holds_everyone() {
        let idle = HostState {
            next_start: Some(10),
            ..HostState::default()
        };
        let cooling = HostState {
            cooldown_until: Some(4_000),
            ..HostState::default()
        };

        assert_eq!(decide(&idle, &ask(1_000, 200, 0)).0, Grant::StartAt(1_000));
        assert_eq!(
            decide(&cooling, &ask(1_000, 200, 60_000)).0,
            Grant::Wait(3_000)
        );
    }

    #[test]
    fn a_slot_is_taken_until_released_or_lapsed() {
        let held = HostState {
            slots: vec![Some(5_000), None],
            ..HostState::default()
        };
        let take = |slot, now| Ask {
            now,
            interval: None,
            horizon: now,
            slot: Some(Slot::new(slot, now + 30_000)),
            slots: 2,
        };

        assert!(held.slot_taken(0, 1_000) && !held.slot_taken(1, 1_000));
        assert!(!held.slot_taken(0, 5_000), "lapsed");
        assert_eq!(decide(&held, &take(0, 1_000)).0, Grant::Wait(SLOT_RETRY_MS));
        assert_eq!(decide(&held, &take(0, 5_000)).0, Grant::StartAt(5_000));
        assert_eq!(
            take(0, 1_000).repicked(&held).slot,
            Some(Slot::new(1, 31_000))
        );
    }

    #[test]
    fn a_slot_alone_is_granted_whatever_the_schedule_has_booked_ahead() {
        let booked_far = HostState {
            next_start: Some(3_600_000),
            ..HostState::default()
        };
        let slot_only = Ask {
            now: 1_000,
            interval: None,
            horizon: 1_000,
            slot: Some(Slot::new(0, 40_000)),
            slots: 2,
        };

        let (grant, after) = decide(&booked_far, &slot_only);

        assert_eq!(grant, Grant::StartAt(1_000));
        assert_eq!(
            after.next_start,
            Some(3_600_000),
            "the schedule is left as it is"
        );
        assert_eq!(after.slot_until(0), 40_000);
    }

    #[test]
    fn a_slowdown_wears_off_by_half_lives_and_stretches_the_interval() {
        let slowed = HostState {
            slowdown: Some((2.0, 0)),
            ..HostState::default()
        };

        let kneed = HostState {
            slowdown: Some((2.5, 0)),
            knee: Some(2.0),
            ..HostState::default()
        };
        let to_knee = TO_KNEE_HALF_LIFE_MS * 1.25_f64.log2();

        assert_eq!(slowed.slowdown_at(60_000), 1.0);
        assert!((slowed.slowdown_at(30_000) - 2.0_f64.sqrt()).abs() < 1e-9);
        assert_eq!(interval(Some(5.0), 2.0), Some(400));
        assert!(
            (kneed.slowdown_at(to_knee as Millis) - 2.0).abs() < 1e-3,
            "at the knee in 3 s"
        );
        let past = kneed.slowdown_at(to_knee as Millis + 240_000);
        assert!(
            (past - 1.0).abs() < 1e-3,
            "past it by half in 4 minutes: {past}"
        );
    }

    #[test]
    fn crawl_delay_lowers_the_rate_never_raises_it() {
        let limits = HostLimits {
            max_rps: Some(5.0),
            max_inflight: Some(4),
        };

        assert_eq!(limits.with_crawl_delay(Some(2.0)).max_rps, Some(0.5));
        assert_eq!(limits.with_crawl_delay(Some(0.1)).max_rps, Some(5.0));
        assert_eq!(
            HostLimits::none().with_crawl_delay(Some(1.0)).max_rps,
            Some(1.0)
        );
    }
}
