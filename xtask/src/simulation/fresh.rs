//! Fresh runs of 1,000,000 tasks under the limits above a partition (a new table in
//! standard mode, a warmed one in provisioned mode), their capacity floors and costs, and
//! goodput against offered load: the figures of the simulation's "fresh run" part.

use conveyor_ops::submit::sharding;
use conveyor_worker::domain::model::Sharding;
use rayon::prelude::*;
use std::time::Instant;

use super::capacity::{
    Mapping, NEW_TABLE_READ_UNITS, NEW_TABLE_WRITE_UNITS, PEAK_WINDOW, PREFIX_PUTS,
};
use super::dynamo::{SECOND, WRITE_UNITS};
use super::{Counting, Fresh, Layout, Outcome, Params, simulate};

/// The fresh run's size.
pub const TASKS: u64 = 1_000_000;
/// The rate the warmed table is set for, and its warm throughput as docs/deploying.md
/// advises: 5 write units a task (the claim, the transaction's two items at twice the
/// cost) and 3 read units (its cost line: 3,000 a thousand tasks), each 20% over the rate
/// (a run's keys hash onto the table's partitions unevenly).
pub const WARM_RATE: f64 = 10_000.0;
pub const HEADROOM: f64 = 1.2;
pub const WRITES_PER_TASK: f64 = 5.0;
pub const READS_PER_TASK: f64 = 3.0;
/// A task's mean time at no limit: the page (log-normal, median 0.8 s, sigma 0.5: mean
/// 0.8 * e^(0.125)) and its requests (GetItem, claim, PUT, transaction, the slot's turn).
pub fn task_seconds() -> f64 {
    0.8 * (0.125_f64).exp() + 0.004 + 0.006 + 0.030 + 0.015 + 0.015
}
/// The v3 layout's partition keys (a task's counter shard) and S3 prefixes.
pub const V3_KEYS: u32 = 16_384;
pub const V3_PREFIXES: u32 = 256;
/// Split-for-heat delays (guesses: AWS documents neither).
pub const SPLIT_DELAY_S: f64 = 300.0;
pub const PREFIX_DELAY_S: f64 = 600.0;
/// On-demand list prices (us-east-1): per write and read unit, per PUT.
pub const PRICE_WRITE: f64 = 0.625e-6;
pub const PRICE_READ: f64 = 0.125e-6;
pub const PRICE_PUT: f64 = 0.005e-3;

/// The data contract a fresh run is laid out by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// Today: task items on one partition key, results on one prefix.
    V2,
    /// Planned: task items on 16,384 keys, results on 256 prefixes.
    V3,
}

/// A fresh run's table and mapping.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setup {
    pub label: &'static str,
    pub warm_write: f64,
    pub warm_read: f64,
    pub mapping: Mapping,
    /// Throttling lets a request pass while any units are left (a sensitivity).
    pub debt: bool,
}

/// (a) a new table, the mapping in standard mode at its most (1,250 invocations).
pub const NEW_STANDARD: Setup = Setup {
    label: "(a) new table, standard mode",
    warm_write: 0.0,
    warm_read: 0.0,
    mapping: Mapping::Standard { max: 1_250 },
    debt: false,
};
/// (a) with throttling that lets a request pass while any units are left.
pub const NEW_STANDARD_DEBT: Setup = Setup {
    label: "(a') new table, standard mode, a request passing while units are left",
    debt: true,
    ..NEW_STANDARD
};
/// (b) warmed for 10,000 tasks a second; provisioned mode with the pollers of that rate
/// ready, 20% over (120 pollers: 1,200 invocations, 12,000 records, about 1.2 s of tasks).
pub const WARM_PROVISIONED: Setup = Setup {
    label: "(b) warmed table, provisioned mode",
    warm_write: WARM_RATE * WRITES_PER_TASK * HEADROOM,
    warm_read: WARM_RATE * READS_PER_TASK * HEADROOM,
    mapping: Mapping::Provisioned {
        min_pollers: 120,
        max_pollers: 120,
    },
    debt: false,
};
/// (b) with the default 2 pollers ready, scaling to 100.
pub const WARM_FEW_POLLERS: Setup = Setup {
    label: "(b') warmed table, provisioned, 2 pollers ready",
    mapping: Mapping::Provisioned {
        min_pollers: 2,
        max_pollers: 100,
    },
    ..WARM_PROVISIONED
};
/// (b) with twice the fleet the table is warmed for (200 pollers).
pub const WARM_TWICE_FLEET: Setup = Setup {
    label: "(b'') warmed table, provisioned, 200 pollers",
    mapping: Mapping::Provisioned {
        min_pollers: 200,
        max_pollers: 200,
    },
    ..WARM_PROVISIONED
};

/// The fresh surroundings of a setup under a contract.
pub fn fresh(setup: Setup, contract: Contract) -> Fresh {
    let (layout, prefixes) = match contract {
        Contract::V2 => (Layout::OneKey, 1),
        Contract::V3 => (Layout::Spread { keys: V3_KEYS }, V3_PREFIXES),
    };
    Fresh {
        warm_read: setup.warm_read,
        warm_write: setup.warm_write,
        mapping: setup.mapping,
        layout,
        split_delay_s: SPLIT_DELAY_S,
        prefix_delay_s: PREFIX_DELAY_S,
        prefixes,
        debt: setup.debt,
    }
}

/// A whole fresh run's parameters, counted as `conveyor-ops submit` counts it by default.
pub fn run_params(setup: Setup, contract: Contract, tasks: u64) -> Params {
    let counting = match sharding(tasks, None, None) {
        Some(Sharding { shards, groups }) => Counting::Shards { shards, groups },
        None => Counting::RunItem,
    };
    Params {
        counting,
        tasks: Some(tasks),
        seconds: 4.0 * 3_600.0,
        warmup: 0.0,
        fresh: Some(fresh(setup, contract)),
        ..Params::default()
    }
}

/// One fresh run and what bounds it.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub setup: Setup,
    pub contract: Contract,
    pub outcome: Outcome,
    /// The run's end if every capacity were used fully, without throttling.
    pub floor: f64,
    /// Seconds it took to simulate.
    pub took: f64,
}

/// The capacities of a fresh run at each second, in tasks a second: the fleet's records
/// in flight over a task's time, the table's write and read rates over a task's units, the
/// task key's partitions (3 write units a task on it) and the prefixes (one PUT a task).
/// A hot key or prefix splits each delay from the start; the table doubles at each 30
/// minutes it was the limit.
pub fn floor_rate(fresh: &Fresh, per_sandbox: u32, t: f64, table: (f64, f64)) -> f64 {
    let doublings = |delay: f64| 2_f64.powi((t / delay).floor().min(20.0) as i32);
    let invocations = fresh.mapping.at((t * SECOND as f64) as u64);
    let fleet = f64::from(invocations) * f64::from(per_sandbox) / task_seconds();
    let (write, read) = table;
    let mut rate = fleet
        .min(write / WRITES_PER_TASK)
        .min(read / READS_PER_TASK);
    if fresh.layout == Layout::OneKey {
        let parts = doublings(fresh.split_delay_s).min(1_024.0);
        rate = rate.min(parts * WRITE_UNITS / 3.0);
    }
    let prefixes = f64::from(fresh.prefixes) * doublings(fresh.prefix_delay_s);
    rate.min(prefixes * PREFIX_PUTS)
}

/// The floor: capacities integrated a second at a time until every task is done, plus one
/// task's time (the last tasks' own).
pub fn floor(fresh: &Fresh, per_sandbox: u32, tasks: u64) -> f64 {
    let mut table = (
        NEW_TABLE_WRITE_UNITS.max(fresh.warm_write),
        NEW_TABLE_READ_UNITS.max(fresh.warm_read),
    );
    let window = PEAK_WINDOW / SECOND;
    let (mut done, mut peak) = (0.0, 0.0_f64);
    for second in 0..(24 * 3_600) {
        if second > 0 && second % window == 0 {
            let busiest = peak;
            table = (
                table.0.max(2.0 * busiest * WRITES_PER_TASK),
                table.1.max(2.0 * busiest * READS_PER_TASK),
            );
            peak = 0.0;
        }
        let rate = floor_rate(fresh, per_sandbox, second as f64, table);
        peak = peak.max(rate);
        if done + rate >= tasks as f64 {
            return second as f64 + (tasks as f64 - done) / rate + task_seconds();
        }
        done += rate;
    }
    f64::INFINITY
}

/// The fresh runs shown: (a) and (b) under both contracts, and (b)'s variations in v3.
pub fn runs() -> Vec<RunRow> {
    let mut situations: Vec<(Setup, Contract)> = [NEW_STANDARD, WARM_PROVISIONED]
        .into_iter()
        .flat_map(|setup| [Contract::V2, Contract::V3].map(|c| (setup, c)))
        .collect();
    situations.push((WARM_FEW_POLLERS, Contract::V3));
    situations.push((WARM_TWICE_FLEET, Contract::V3));
    situations.push((NEW_STANDARD_DEBT, Contract::V3));
    situations
        .into_par_iter()
        .map(|(setup, contract)| {
            let started = Instant::now();
            let params = run_params(setup, contract, TASKS);
            let fresh = params.fresh.expect("a fresh run's parameters have it");
            RunRow {
                setup,
                contract,
                outcome: simulate(&params),
                floor: floor(&fresh, params.per_sandbox, TASKS),
                took: started.elapsed().as_secs_f64(),
            }
        })
        .collect()
}

/// A hot resource overloaded: what it is, its capacity in tasks a second, and the fresh
/// surroundings that make it the one limit.
#[derive(Debug, Clone, Copy)]
pub struct Hot {
    pub label: &'static str,
    pub capacity: f64,
    pub fresh: Fresh,
}

/// The hot resources: a new table's write rate (v3 keys), one partition of a v2 task key
/// (not split in the time), one S3 prefix (not partitioned in the time).
pub fn hot_resources() -> [Hot; 3] {
    let never = 1e9;
    let warm = |rate: f64| Fresh {
        warm_write: rate * WRITES_PER_TASK,
        warm_read: rate * READS_PER_TASK,
        split_delay_s: never,
        prefix_delay_s: never,
        ..fresh(NEW_STANDARD, Contract::V3)
    };
    let fixed = |fresh: Fresh| Fresh {
        mapping: Mapping::Fixed,
        ..fresh
    };
    [
        Hot {
            label: "a new table's 4,000 write units a second (v3 keys)",
            capacity: NEW_TABLE_WRITE_UNITS / WRITES_PER_TASK,
            fresh: fixed(fresh(NEW_STANDARD, Contract::V3)),
        },
        Hot {
            label: "one partition of a v2 run's task key (1,000 write units, 3 a task)",
            capacity: WRITE_UNITS / 3.0,
            fresh: fixed(Fresh {
                layout: Layout::OneKey,
                ..warm(20_000.0)
            }),
        },
        Hot {
            label: "one S3 prefix (3,500 PUTs a second, v3 keys)",
            capacity: PREFIX_PUTS,
            fresh: fixed(Fresh {
                prefixes: 1,
                ..warm(4.0 * 4.0 * PREFIX_PUTS)
            }),
        },
    ]
}

/// Offered loads, in multiples of the hot resource's capacity.
pub const LOADS: [f64; 3] = [1.0, 2.0, 4.0];
/// A goodput situation's simulated time and warm-up (long enough for holds to settle).
const GOODPUT_SECONDS: f64 = 300.0;
const GOODPUT_WARMUP: f64 = 120.0;

/// Goodput at each load on each hot resource.
#[derive(Debug, Clone)]
pub struct GoodputRow {
    pub hot: &'static str,
    pub capacity: f64,
    pub load: f64,
    /// Throttling lets a request pass while any units are left (a sensitivity).
    pub debt: bool,
    /// The worker's pressure (AIMD) on; off: every slot always works, as before it.
    pub aimd: bool,
    pub in_flight: u32,
    pub outcome: Outcome,
    /// Seconds it took to simulate.
    pub took: f64,
}

/// The steady-state parameters of `load` times a hot resource's capacity.
pub fn goodput_params(hot: &Hot, load: f64) -> Params {
    let in_flight = (load * hot.capacity * task_seconds()).round() as u32;
    Params {
        in_flight,
        counting: Counting::Shards {
            shards: V3_KEYS,
            groups: 256,
        },
        seconds: GOODPUT_SECONDS,
        warmup: GOODPUT_WARMUP,
        fresh: Some(hot.fresh),
        ..Params::default()
    }
}

/// Each load on each hot resource; then 4x on DynamoDB's two with debt allowed; then 4x on
/// each without the worker's pressure (AIMD), to measure it against none.
pub fn goodput() -> Vec<GoodputRow> {
    let top = LOADS[LOADS.len() - 1];
    let mut situations: Vec<(Hot, f64, bool)> = hot_resources()
        .into_iter()
        .flat_map(|hot| LOADS.map(|load| (hot, load, true)))
        .collect();
    for mut hot in hot_resources().into_iter().take(2) {
        hot.fresh.debt = true;
        situations.push((hot, top, true));
    }
    situations.extend(hot_resources().into_iter().map(|hot| (hot, top, false)));
    situations
        .into_par_iter()
        .map(|(hot, load, aimd)| {
            let started = Instant::now();
            let params = Params {
                aimd,
                ..goodput_params(&hot, load)
            };
            GoodputRow {
                hot: hot.label,
                capacity: hot.capacity,
                load,
                debt: hot.fresh.debt,
                aimd,
                in_flight: params.in_flight,
                outcome: simulate(&params),
                took: started.elapsed().as_secs_f64(),
            }
        })
        .collect()
}

/// Dollars per million tasks at on-demand list prices: the run's, and the floor's (one
/// write unit and one PUT a task).
pub fn dollars_per_million(outcome: &Outcome) -> f64 {
    1e6 * (outcome.write_units_per_task * PRICE_WRITE
        + outcome.read_units_per_task * PRICE_READ
        + outcome.puts_per_task * PRICE_PUT)
}

pub fn floor_dollars_per_million() -> f64 {
    1e6 * (PRICE_WRITE + PRICE_PUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_tables_floor_is_its_write_rate_and_a_warm_ones_its_fleet() {
        let new = floor(&fresh(NEW_STANDARD, Contract::V3), 10, TASKS);
        let warm = floor(&fresh(WARM_PROVISIONED, Contract::V3), 10, TASKS);

        // 4,000 write units, 5 a task: 800 tasks a second.
        assert!((1_240.0..1_270.0).contains(&new), "{new}");
        // 12,000 records of ~0.97 s: ~12,400 a second, under the table's 12,000 (20% over
        // 10,000): the table the limit, ~83 s for a million.
        assert!((82.0..86.0).contains(&warm), "{warm}");
    }

    #[test]
    fn a_small_fresh_run_on_a_new_table_completes_near_its_floor() {
        let params = Params {
            fresh: Some(Fresh {
                mapping: Mapping::Fixed,
                ..fresh(NEW_STANDARD, Contract::V3)
            }),
            in_flight: 500,
            ..run_params(NEW_STANDARD, Contract::V3, 20_000)
        };

        let outcome = simulate(&params);

        // 500 in flight: ~515 a second, under the table's 800.
        let at = outcome.completed_at.expect("it completes");
        assert!((38.0..45.0).contains(&at), "{outcome:?}");
        // 5 a task, and the climbs of a small run's counter tree (about 20 tasks a shard).
        assert!(outcome.write_units_per_task < 5.6, "{outcome:?}");
        assert_eq!(outcome.dead_letters, 0);
    }
}
