//! `make bench`'s run progress simulation: runs it and writes its section of BENCHMARKS.md
//! and docs/run-progress.svg, docs/fresh-run.svg (run from the workspace). `simulate TASKS IN_FLIGHT SHARDS[/GROUPS]...`
//! prints one situation per counting instead (0 tasks: steady state; 0 shards: the run item);
//! `simulate fresh` prints the fresh runs and goodput part alone, each situation timed.

use std::time::Instant;

use xtask::simulation::fresh;
use xtask::simulation::fresh_report::{self, FRESH_CHART};
use xtask::simulation::report::{self, CHART};
use xtask::simulation::{Counting, Params, simulate};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "fresh") {
        return fresh_part();
    }
    if !args.is_empty() {
        return explore(&args);
    }
    let started = Instant::now();
    let figures = report::run();
    let section = report::markdown(&figures);
    std::fs::write(CHART, report::chart(&figures.sweep)?)?;
    std::fs::write(FRESH_CHART, fresh_report::chart(&figures.fresh_runs)?)?;
    let doc = std::fs::read_to_string("BENCHMARKS.md").unwrap_or_else(|_| "# Benchmarks\n".into());
    std::fs::write("BENCHMARKS.md", report::splice(&doc, &section))?;
    println!(
        "{section}\n(simulated in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The fresh runs and goodput alone, with how long each took to simulate.
fn fresh_part() -> Result<()> {
    let started = Instant::now();
    let (runs, goodput) = rayon::join(fresh::runs, fresh::goodput);
    println!("{}", fresh_report::markdown(&runs, &goodput));
    for row in &runs {
        println!("{} {:?}: {:.1} s", row.setup.label, row.contract, row.took);
    }
    for row in &goodput {
        println!("{} {}x: {:.1} s", row.hot, row.load, row.took);
    }
    println!("(simulated in {:.1} s)", started.elapsed().as_secs_f64());
    Ok(())
}

fn explore(args: &[String]) -> Result<()> {
    let [tasks, in_flight, countings @ ..] = args else {
        return Err("usage: simulate [TASKS IN_FLIGHT SHARDS[/GROUPS]...]".into());
    };
    let (tasks, in_flight): (u64, u32) = (tasks.parse()?, in_flight.parse()?);
    for spec in countings {
        let (shards, groups) = spec.split_once('/').unwrap_or((spec, "0"));
        let counting = match (shards.parse()?, groups.parse()?) {
            (0, _) => Counting::RunItem,
            (shards, groups) => Counting::Shards { shards, groups },
        };
        let params = Params {
            in_flight,
            counting,
            tasks: (tasks > 0).then_some(tasks),
            seconds: if tasks > 0 { 100_000.0 } else { 40.0 },
            warmup: if tasks > 0 { 0.0 } else { 10.0 },
            ..Params::default()
        };
        println!("{counting:?}: {:?}", simulate(&params));
    }
    Ok(())
}
