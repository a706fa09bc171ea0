//! Where the fleet's requests land: which partition holds a task's item or a counter, and
//! which S3 prefix a result goes to. Steady states put each counter on a partition of its
//! own; a fresh run hashes its keys onto the table's physical partitions (as many as its
//! capacity implies), a v1/v2 run's task key on partitions of its own split for heat.

use super::capacity::{Heat, Prefix};
use super::capacity::{NEW_TABLE_READ_UNITS, NEW_TABLE_WRITE_UNITS};
use super::dynamo::{Micros, READ_UNITS, SECOND, Table, WRITE_UNITS};
use super::{Layout, Params, micros};

/// The job's partition (the job and run items; the run is contended item 0).
pub(super) const JOB: usize = 0;
/// The most partitions a hot task key splits into.
const MOST_HOT_PARTS: u32 = 1_024;

pub(super) struct Places {
    /// Contended items (the counter tree's).
    items: usize,
    /// A steady state's task partitions (after the items), if any.
    task_partitions: Option<u32>,
    fresh: Option<FreshPlaces>,
}

struct FreshPlaces {
    layout: Layout,
    /// A v1/v2 run's task key: its first partition and its heat.
    hot: Option<(usize, Heat)>,
    /// The table's physical partitions: the first, and how many.
    physical_first: usize,
    physical: usize,
    prefixes: Vec<Prefix>,
    /// The second the physical partitions last followed the table's rates.
    followed: Micros,
}

impl Places {
    /// The places of `params`, and the partitions the table needs at first.
    pub(super) fn new(params: &Params, items: usize) -> (Self, usize) {
        let steady = items + params.task_partitions.unwrap_or(0) as usize;
        // The floor (no limits) needs no fresh places: nothing is ever hot.
        let Some(fresh) = params.fresh.filter(|_| params.limits) else {
            let places = Self {
                items,
                task_partitions: params.task_partitions,
                fresh: None,
            };
            return (places, steady);
        };
        let (hot, physical_first) = match fresh.layout {
            Layout::OneKey => {
                let heat = Heat::new(WRITE_UNITS, micros(fresh.split_delay_s), MOST_HOT_PARTS);
                (Some((1, heat)), 1 + MOST_HOT_PARTS as usize)
            }
            Layout::Spread { .. } => (None, 1),
        };
        let physical = physical_partitions(fresh.warm_read, fresh.warm_write);
        let prefixes = fresh.prefixes.max(1) as usize;
        let places = FreshPlaces {
            layout: fresh.layout,
            hot,
            physical_first,
            physical,
            prefixes: vec![Prefix::new(micros(fresh.prefix_delay_s)); prefixes],
            followed: 0,
        };
        let partitions = physical_first + physical;
        let places = Self {
            items,
            task_partitions: None,
            fresh: Some(places),
        };
        (places, partitions)
    }

    /// The partition of a contended item.
    pub(super) fn item(&self, item: usize) -> usize {
        match &self.fresh {
            Some(f) if item != 0 => {
                f.physical_first + (spread(item as u64 ^ SALT) % f.physical as u64) as usize
            }
            Some(_) => JOB,
            None => item,
        }
    }

    /// The partition of a task's item (`None`: one never hot).
    pub(super) fn task(&self, id: u64) -> Option<usize> {
        let Some(f) = &self.fresh else {
            let partitions = self.task_partitions?;
            return Some(self.items + (spread(id) % u64::from(partitions)) as usize);
        };
        Some(match (&f.hot, f.layout) {
            (Some((first, heat)), _) => first + (spread(id) % u64::from(heat.parts)) as usize,
            (None, Layout::Spread { keys }) => {
                let key = spread(id) % u64::from(keys.max(1));
                f.physical_first + (spread(key ^ SALT) % f.physical as u64) as usize
            }
            (None, Layout::OneKey) => unreachable!("a run on one key has its heat"),
        })
    }

    /// `units` asked of the task key (a hot key's heat; reads count a third).
    pub(super) fn ask_task(&mut self, now: Micros, units: f64) {
        if let Some((_, heat)) = self.fresh.as_mut().and_then(|f| f.hot.as_mut()) {
            heat.ask(now, units);
        }
    }

    /// The physical partitions follow the table's allowed rates as they grow (looked at
    /// once a second).
    pub(super) fn follow(&mut self, now: Micros, table: &mut Table) {
        let (Some(f), Some((read, write))) = (self.fresh.as_mut(), table.limit.as_mut()) else {
            return;
        };
        if now / SECOND == f.followed {
            return;
        }
        f.followed = now / SECOND;
        let needed = physical_partitions(read.allowed(now), write.allowed(now));
        if needed > f.physical {
            f.physical = needed;
            table.grow(f.physical_first + needed);
        }
    }

    /// A result's PUT: taken, or answered 503 SlowDown (false). Always taken in a steady
    /// state (S3 not modelled there).
    pub(super) fn put(&mut self, now: Micros, id: u64) -> bool {
        let Some(f) = self.fresh.as_mut() else {
            return true;
        };
        let prefix = (spread(id ^ PREFIX_SALT) % f.prefixes.len() as u64) as usize;
        f.prefixes[prefix].put(now)
    }

    /// When the task key and the first prefix split (seconds).
    pub(super) fn splits(&self) -> (Vec<f64>, Vec<f64>) {
        let Some(f) = &self.fresh else {
            return (Vec::new(), Vec::new());
        };
        let seconds = |at: &[Micros]| at.iter().map(|&t| t as f64 / SECOND as f64).collect();
        let key = f
            .hot
            .as_ref()
            .map_or(Vec::new(), |(_, h)| seconds(&h.splits));
        (key, seconds(&f.prefixes[0].heat.splits))
    }
}

/// The table's physical partitions for its rates: 1,000 write or 3,000 read units each.
fn physical_partitions(read: f64, write: f64) -> usize {
    let (read, write) = (
        read.max(NEW_TABLE_READ_UNITS),
        write.max(NEW_TABLE_WRITE_UNITS),
    );
    (write / WRITE_UNITS).max(read / READ_UNITS).ceil() as usize
}

/// Salts so that a key's hash onto partitions is not its hash onto shards.
const SALT: u64 = 0x05EE_D0F7_AB1E;
const PREFIX_SALT: u64 = 0x00C0_FFEE_5EED;

/// A task id's spread over shards and partitions, as a hash spreads real ids (splitmix64).
pub(super) fn spread(id: u64) -> u64 {
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
