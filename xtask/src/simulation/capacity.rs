//! The limits a fresh run meets above one partition's: an on-demand table's capacity as it
//! grows, a hot key or S3 prefix split for heat after a delay, and the SQS event source
//! mapping's scaling (how many records are in flight when).

use super::clock::{Micros, SECOND};

/// What a new on-demand table sustains until it has seen more (AWS's documented figures).
pub const NEW_TABLE_WRITE_UNITS: f64 = 4_000.0;
pub const NEW_TABLE_READ_UNITS: f64 = 12_000.0;
/// The window after which an on-demand table allows twice its previous peak.
pub const PEAK_WINDOW: Micros = 1_800 * SECOND;
/// PUTs a second one partitioned S3 prefix takes.
pub const PREFIX_PUTS: f64 = 3_500.0;
/// Records one Lambda sandbox takes at once (a batch of 10).
pub const PER_SANDBOX: u32 = 10;

/// A rate that grants at most its units a second, with a short burst (50 ms of its rate):
/// over any window of `w` seconds it grants at most `rate * (w + 0.05)`.
#[derive(Debug, Clone)]
pub struct Rate {
    rate: f64,
    tokens: f64,
    at: Micros,
    /// A request passes while any units are left, taking the rest as debt (else it needs
    /// its units).
    pub debt: bool,
}

/// The burst a `Rate` keeps, in seconds of its rate.
const BURST_S: f64 = 0.05;

impl Rate {
    /// Starts empty: its first second grants at most its rate.
    pub fn new(rate: f64) -> Self {
        Self {
            rate,
            tokens: 0.0,
            at: 0,
            debt: false,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    pub fn set_rate(&mut self, now: Micros, rate: f64) {
        self.refill(now);
        self.rate = rate;
    }

    fn refill(&mut self, now: Micros) {
        let elapsed = now.saturating_sub(self.at) as f64 / SECOND as f64;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate * BURST_S);
        self.at = self.at.max(now);
    }

    /// Whether `units` are there now (not taken).
    pub fn has(&mut self, now: Micros, units: f64) -> bool {
        self.refill(now);
        // A request larger than the burst still passes once the burst is full.
        match self.debt {
            true => self.tokens > 0.0,
            false => self.tokens >= units.min(self.rate * BURST_S),
        }
    }

    pub fn take(&mut self, units: f64) {
        self.tokens -= units;
    }
}

/// An on-demand table's allowed rate (of one kind of unit): its start (a new table's, or
/// the warm throughput set), then at the end of each 30 minutes the larger of that and
/// twice the busiest second of those 30 minutes (the model's reading of "up to twice the
/// previous peak within 30 minutes").
#[derive(Debug, Clone)]
pub struct OnDemand {
    pub rate: Rate,
    window_end: Micros,
    peak: f64,
    second: u64,
    this_second: f64,
}

impl OnDemand {
    /// A table that takes `warm` units a second at once (0: a new table's start).
    pub fn new(new_table: f64, warm: f64) -> Self {
        Self {
            rate: Rate::new(new_table.max(warm)),
            window_end: PEAK_WINDOW,
            peak: 0.0,
            second: 0,
            this_second: 0.0,
        }
    }

    /// The rate allowed now (after growing, if a window ended).
    pub fn allowed(&mut self, now: Micros) -> f64 {
        self.close_second(now);
        while now >= self.window_end {
            let grown = self.rate.rate().max(2.0 * self.peak);
            self.rate.set_rate(now, grown);
            self.peak = 0.0;
            self.window_end += PEAK_WINDOW;
        }
        self.rate.rate()
    }

    /// Whether `units` may be granted now.
    pub fn has(&mut self, now: Micros, units: f64) -> bool {
        self.allowed(now);
        self.rate.has(now, units)
    }

    /// `units` granted now.
    pub fn take(&mut self, now: Micros, units: f64) {
        self.close_second(now);
        self.rate.take(units);
        self.this_second += units;
    }

    fn close_second(&mut self, now: Micros) {
        let second = now / SECOND;
        if second != self.second {
            self.peak = self.peak.max(self.this_second);
            self.this_second = 0.0;
            self.second = second;
        }
    }
}

/// A hot key (a v1/v2 run's task items) or S3 prefix split for heat: `parts` partitions,
/// doubled each time it has been hot for `delay` more (a second is hot when what was asked
/// of it, granted or not, came to at least half of its partitions' capacity; cool seconds do
/// not count, nor do they reset the clock), up to `max_parts`.
#[derive(Debug, Clone)]
pub struct Heat {
    pub parts: u32,
    max_parts: u32,
    per_part: f64,
    delay: Micros,
    hot_for: Micros,
    second: u64,
    asked: f64,
    /// When each split happened.
    pub splits: Vec<Micros>,
}

impl Heat {
    pub fn new(per_part: f64, delay: Micros, max_parts: u32) -> Self {
        Self {
            parts: 1,
            max_parts,
            per_part,
            delay,
            hot_for: 0,
            second: 0,
            asked: 0.0,
            splits: Vec::new(),
        }
    }

    /// `units` asked of it now; true when it split (its parts doubled) at this second.
    pub fn ask(&mut self, now: Micros, units: f64) -> bool {
        let second = now / SECOND;
        let mut split = false;
        if second != self.second {
            if self.asked >= 0.5 * self.per_part * f64::from(self.parts) {
                self.hot_for += SECOND;
            }
            if self.hot_for >= self.delay && self.parts < self.max_parts {
                self.parts *= 2;
                self.hot_for = 0;
                self.splits.push(second * SECOND);
                split = true;
            }
            self.second = second;
            self.asked = 0.0;
        }
        self.asked += units;
        split
    }
}

/// An S3 prefix: 3,500 PUTs a second per partition of it, partitioned for heat.
#[derive(Debug, Clone)]
pub struct Prefix {
    pub heat: Heat,
    rate: Rate,
}

impl Prefix {
    pub fn new(delay: Micros) -> Self {
        Self {
            heat: Heat::new(PREFIX_PUTS, delay, 1 << 10),
            rate: Rate::new(PREFIX_PUTS),
        }
    }

    /// One PUT: taken, or answered 503 SlowDown (false).
    pub fn put(&mut self, now: Micros) -> bool {
        if self.heat.ask(now, 1.0) {
            let rate = PREFIX_PUTS * f64::from(self.heat.parts);
            self.rate.set_rate(now, rate);
        }
        if !self.rate.has(now, 1.0) {
            return false;
        }
        self.rate.take(1.0);
        true
    }
}

/// The SQS event source mapping's scaling, in concurrent invocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// Every record in flight from the start (a steady state's fleet).
    Fixed,
    /// Standard mode: 5 invocations at first, then up to 300 more a minute, to `max` (at
    /// most 1,250); it does not scale down while records fail.
    Standard { max: u32 },
    /// Provisioned mode: `min_pollers` event pollers ready (10 invocations each), then up to
    /// 1,000 more invocations a minute, to `max_pollers` x 10 (at most 20,000).
    Provisioned { min_pollers: u32, max_pollers: u32 },
}

impl Mapping {
    /// Invocations at first, added a minute, and the most.
    fn shape(self) -> (u32, u32, u32) {
        match self {
            Mapping::Fixed => (u32::MAX, 0, u32::MAX),
            Mapping::Standard { max } => (5, 300, max.min(1_250)),
            Mapping::Provisioned {
                min_pollers,
                max_pollers,
            } => (min_pollers * 10, 1_000, (max_pollers * 10).min(20_000)),
        }
    }

    /// The most concurrent invocations.
    pub fn most(self) -> u32 {
        self.shape().2
    }

    /// Concurrent invocations at `t` (as many as have started by then).
    pub fn at(self, t: Micros) -> u32 {
        let (first, per_minute, most) = self.shape();
        if self == Mapping::Fixed {
            return most;
        }
        let added = (t as f64 / (60 * SECOND) as f64 * f64::from(per_minute)).floor();
        (f64::from(first) + added).min(f64::from(most)) as u32
    }

    /// When the `n`th invocation (from 0) starts: added evenly through each minute.
    pub fn start_of(self, n: u32) -> Micros {
        let (first, per_minute, _) = self.shape();
        if n < first {
            return 0;
        }
        let minutes = f64::from(n - first + 1) / f64::from(per_minute);
        (minutes * 60.0 * SECOND as f64).ceil() as Micros
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units granted by `ask` tried every millisecond, per whole second, for `seconds`.
    fn granted_per_second(seconds: u64, mut ask: impl FnMut(Micros) -> bool) -> Vec<u32> {
        let mut per_second = vec![0; seconds as usize];
        for ms in 0..seconds * 1_000 {
            for _ in 0..10 {
                if ask(ms * 1_000) {
                    per_second[(ms / 1_000) as usize] += 1;
                }
            }
        }
        per_second
    }

    #[test]
    fn a_new_table_never_grants_more_than_4000_write_units_a_second_at_first() {
        let mut table = OnDemand::new(NEW_TABLE_WRITE_UNITS, 0.0);

        // 10,000 units a second asked for a minute.
        let granted = granted_per_second(60, |now| {
            let ok = table.has(now, 1.0);
            if ok {
                table.take(now, 1.0);
            }
            ok
        });

        assert!(granted.iter().all(|&g| g <= 4_000), "{granted:?}");
        assert!(granted[1..].iter().all(|&g| g >= 3_990), "{granted:?}");
    }

    #[test]
    fn a_busy_table_doubles_its_rate_after_30_minutes_and_not_before() {
        let mut table = OnDemand::new(NEW_TABLE_WRITE_UNITS, 0.0);
        for ms in 0..1_800_000 {
            let now = ms * 1_000;
            while table.has(now, 1.0) {
                table.take(now, 1.0);
            }
        }

        let before = table.allowed(PEAK_WINDOW - 1);
        let after = table.allowed(PEAK_WINDOW);

        assert_eq!(before, NEW_TABLE_WRITE_UNITS);
        assert!((7_900.0..=8_000.0).contains(&after), "{after}");
        assert_eq!(OnDemand::new(4_000.0, 50_000.0).allowed(0), 50_000.0);
    }

    #[test]
    fn a_hot_key_splits_no_earlier_than_its_delay_and_again_after_another() {
        let mut heat = Heat::new(1_000.0, 300 * SECOND, 64);

        // 2,000 units a second asked, for 20 minutes.
        for ms in 0..1_200_000 {
            heat.ask(ms * 1_000, 2.0);
        }

        assert_eq!(heat.splits, [300, 600, 900].map(|s| s * SECOND));
        assert_eq!(heat.parts, 8);
    }

    #[test]
    fn a_cool_key_does_not_split() {
        let mut heat = Heat::new(1_000.0, 60 * SECOND, 64);

        for ms in 0..600_000 {
            heat.ask(ms * 1_000, 0.4);
        }

        assert_eq!(heat.parts, 1);
    }

    #[test]
    fn a_prefix_takes_at_most_3500_puts_a_second_before_it_is_partitioned() {
        let mut prefix = Prefix::new(120 * SECOND);

        // 10,000 PUTs a second for 3 minutes.
        let granted = granted_per_second(180, |now| prefix.put(now));

        assert!(granted[..120].iter().all(|&g| g <= 3_500), "{granted:?}");
        assert!(granted[121..].iter().all(|&g| g > 6_900), "{granted:?}");
        assert_eq!(prefix.heat.splits, [120 * SECOND]);
    }

    #[test]
    fn standard_mode_adds_at_most_300_invocations_a_minute_up_to_1250() {
        let mapping = Mapping::Standard { max: 5_000 };
        let starts: Vec<Micros> = (0..mapping.most()).map(|n| mapping.start_of(n)).collect();

        for minute in 0..6 {
            let (from, to) = (minute * 60 * SECOND, (minute + 1) * 60 * SECOND);
            let added = starts.iter().filter(|&&s| s > from && s <= to).count();
            assert!(added <= 300, "minute {minute}: {added}");
        }
        assert_eq!(mapping.most(), 1_250);
        assert_eq!(starts.iter().filter(|&&s| s == 0).count(), 5);
    }

    #[test]
    fn provisioned_mode_starts_with_its_pollers_and_adds_1000_a_minute() {
        let mapping = Mapping::Provisioned {
            min_pollers: 2,
            max_pollers: 2_000,
        };

        assert_eq!(mapping.most(), 20_000);
        assert_eq!(mapping.start_of(19), 0);
        let in_a_minute = (0..mapping.most())
            .filter(|&n| mapping.start_of(n) <= 60 * SECOND)
            .count();
        assert_eq!(in_a_minute, 1_020);
        assert_eq!(mapping.at(60 * SECOND), 1_020);
        assert_eq!(mapping.at(3_600 * SECOND), 20_000);
    }
}
