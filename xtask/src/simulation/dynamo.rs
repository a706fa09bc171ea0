//! The simulation's DynamoDB: partitions that grant at most their capacity per second, and
//! items that a transaction holds while it commits, so that an overlapping one is cancelled;
//! for a fresh run, the on-demand table's own rate above its partitions' (`capacity`).

use super::capacity::{NEW_TABLE_READ_UNITS, NEW_TABLE_WRITE_UNITS, OnDemand};

pub use super::clock::{Micros, SECOND};

/// A partition's capacity per second, as DynamoDB documents it.
pub const WRITE_UNITS: f64 = 1_000.0;
pub const READ_UNITS: f64 = 3_000.0;

/// Capacity units refilled at a steady rate, up to one second's worth (a burst of a second
/// at most: the model's assumption; DynamoDB does not document a partition's window).
#[derive(Debug, Clone)]
struct Bucket {
    rate: f64,
    tokens: f64,
    at: Micros,
}

impl Bucket {
    fn new(rate: f64) -> Self {
        Self {
            rate,
            tokens: rate,
            at: 0,
        }
    }

    fn refill(&mut self, now: Micros) {
        let elapsed = now.saturating_sub(self.at) as f64 / SECOND as f64;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        self.at = now;
    }
}

/// One partition: its read and write capacity, and the units it granted.
#[derive(Debug, Clone)]
pub struct Partition {
    read: Bucket,
    write: Bucket,
    pub read_units: f64,
    pub write_units: f64,
}

impl Partition {
    fn with_capacity(read: f64, write: f64) -> Self {
        Self {
            read: Bucket::new(read),
            write: Bucket::new(write),
            read_units: 0.0,
            write_units: 0.0,
        }
    }
}

impl Default for Partition {
    fn default() -> Self {
        Self::with_capacity(READ_UNITS, WRITE_UNITS)
    }
}

/// Where a request lands: a partition (`None`: one never hot, as a run's tasks are once
/// DynamoDB has split their partition for heat) and the contended item it writes, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub partition: Option<usize>,
    pub item: Option<usize>,
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Done,
    /// A partition had no capacity left (`ProvisionedThroughputExceeded`): nothing written.
    Throttled,
    /// An item was held by a transaction in flight (`TransactionConflict`).
    Conflict,
    /// A condition of the transaction failed (`ConditionalCheckFailed`): nothing written.
    Refused,
}

/// The table: partitions, and the contended items (a run item, counter shards) with the
/// time until which a committing transaction holds each.
#[derive(Debug, Clone)]
pub struct Table {
    pub partitions: Vec<Partition>,
    held_until: Vec<Micros>,
    /// How long a transaction holds its items (prepare to commit).
    hold: Micros,
    /// The on-demand table's own read and write rates (`None`: only its partitions').
    pub limit: Option<(OnDemand, OnDemand)>,
    /// Read and write units granted in all (what is billed).
    pub units: (f64, f64),
    /// A request passes while its partitions have any units left, taking the rest as debt
    /// (else it needs all its units there): the sensitivity of throttling to request size.
    pub debt: bool,
}

impl Table {
    pub fn new(partitions: usize, items: usize, hold: Micros) -> Self {
        Self {
            partitions: vec![Partition::default(); partitions],
            held_until: vec![0; items],
            hold,
            limit: None,
            units: (0.0, 0.0),
            debt: false,
        }
    }

    /// The table's own rates: a new on-demand table's, or the warm throughput set (read,
    /// write units a second) if more.
    pub fn on_demand(mut self, warm_read: f64, warm_write: f64, debt: bool) -> Self {
        let mut read = OnDemand::new(NEW_TABLE_READ_UNITS, warm_read);
        let mut write = OnDemand::new(NEW_TABLE_WRITE_UNITS, warm_write);
        (read.rate.debt, write.rate.debt, self.debt) = (debt, debt, debt);
        self.limit = Some((read, write));
        self
    }

    /// Partitions added (a table that grew): each starts with a second's capacity.
    pub fn grow(&mut self, partitions: usize) {
        let len = self.partitions.len().max(partitions);
        self.partitions.resize(len, Partition::default());
    }

    /// A table without limits: no partition runs out, no transaction holds anything (the
    /// floor the figures are compared with).
    pub fn unlimited(partitions: usize, items: usize) -> Self {
        let partition = Partition::with_capacity(f64::INFINITY, f64::INFINITY);
        Self {
            partitions: vec![partition; partitions],
            held_until: vec![0; items],
            hold: 0,
            limit: None,
            units: (0.0, 0.0),
            debt: false,
        }
    }

    /// A strongly consistent read of `units`.
    pub fn read(&mut self, now: Micros, partition: Option<usize>, units: f64) -> Answer {
        let Some(p) = partition.map(|p| &mut self.partitions[p]) else {
            return Answer::Done;
        };
        p.read.refill(now);
        let table = self.limit.as_mut().map(|(read, _)| read);
        if !fits(p.read.tokens, units, self.debt) {
            return Answer::Throttled;
        }
        if let Some(table) = table {
            if !table.has(now, units) {
                return Answer::Throttled;
            }
            table.take(now, units);
        }
        p.read.tokens -= units;
        p.read_units += units;
        self.units.0 += units;
        Answer::Done
    }

    /// A single-item write of `units` (not part of a transaction: it holds nothing).
    pub fn write(&mut self, now: Micros, partition: Option<usize>, units: f64) -> Answer {
        let target = Target {
            partition,
            item: None,
        };
        self.apply(now, &[(target, units)], None)
    }

    /// A transaction writing `units` to each target, whose conditions hold or not
    /// (`condition`): throttled if any partition lacks the capacity; cancelled if any item is
    /// held by another transaction, or refused by its condition (either way it consumed its
    /// capacity: the model's conservative assumption); else it holds its items for the hold
    /// time.
    pub fn transact(&mut self, now: Micros, writes: &[(Target, f64)], condition: bool) -> Answer {
        self.apply(now, writes, Some(condition))
    }

    fn apply(
        &mut self,
        now: Micros,
        writes: &[(Target, f64)],
        transaction: Option<bool>,
    ) -> Answer {
        let mut granted = true;
        for (target, _) in writes {
            if let Some(p) = target.partition {
                let bucket = &mut self.partitions[p].write;
                bucket.refill(now);
                granted &= fits(bucket.tokens, needed(writes, p), self.debt);
            }
        }
        let total: f64 = writes.iter().map(|(_, units)| units).sum();
        if let Some((_, table)) = self.limit.as_mut() {
            granted &= table.has(now, total);
            if granted {
                table.take(now, total);
            }
        }
        if !granted {
            return Answer::Throttled;
        }
        self.units.1 += total;
        for (target, units) in writes {
            if let Some(p) = target.partition {
                let partition = &mut self.partitions[p];
                partition.write.tokens -= units;
                partition.write_units += units;
            }
        }
        let items = writes.iter().filter_map(|(t, _)| t.item);
        if items.clone().any(|i| self.held_until[i] > now) {
            return Answer::Conflict;
        }
        match transaction {
            None => Answer::Done,
            Some(false) => Answer::Refused,
            Some(true) => {
                for i in items {
                    self.held_until[i] = now + self.hold;
                }
                Answer::Done
            }
        }
    }
}

/// Whether a request of `units` passes a bucket holding `tokens`.
fn fits(tokens: f64, units: f64, debt: bool) -> bool {
    match debt {
        true => tokens > 0.0,
        false => tokens >= units,
    }
}

/// The units a set of writes needs from one partition.
fn needed(writes: &[(Target, f64)], partition: usize) -> f64 {
    writes
        .iter()
        .filter(|(t, _)| t.partition == Some(partition))
        .map(|(_, units)| units)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(partition: usize, item: Option<usize>) -> Target {
        Target {
            partition: Some(partition),
            item,
        }
    }

    #[test]
    fn a_partition_grants_at_most_its_write_capacity_per_second() {
        let mut table = Table::new(1, 0, 5_000);
        let mut granted = 0.0;

        // Two writes of one unit every millisecond for ten seconds: 2,000 units a second asked.
        for ms in 0..10_000 {
            for _ in 0..2 {
                if table.write(ms * 1_000, Some(0), 1.0) == Answer::Done {
                    granted += 1.0;
                }
            }
        }

        // A second's burst, then 1,000 a second.
        assert!((10_000.0..=11_000.0).contains(&granted), "{granted}");
    }

    #[test]
    fn a_transaction_overlapping_a_committing_one_on_an_item_is_cancelled() {
        let mut table = Table::new(2, 1, 5_000);
        let writes = [(on(0, None), 2.0), (on(1, Some(0)), 2.0)];

        let first = table.transact(0, &writes, true);
        let overlapping = table.transact(4_999, &writes, true);
        let after = table.transact(5_000, &writes, true);

        assert_eq!(
            (first, overlapping, after),
            (Answer::Done, Answer::Conflict, Answer::Done)
        );
        assert_eq!(
            table.partitions[1].write_units, 6.0,
            "a cancelled one costs too"
        );
    }

    #[test]
    fn a_throttled_transaction_writes_nothing_anywhere() {
        let mut table = Table::new(2, 1, 5_000);
        let writes = [(on(0, None), 2.0), (on(1, Some(0)), 2.0)];
        table.partitions[1].write.tokens = 1.0;

        let answer = table.transact(0, &writes, true);

        assert_eq!(answer, Answer::Throttled);
        assert_eq!(table.partitions[0].write_units, 0.0);
        table.partitions[1].write.tokens = 10.0;
        assert_eq!(
            table.transact(0, &writes, true),
            Answer::Done,
            "nothing held"
        );
    }
}
