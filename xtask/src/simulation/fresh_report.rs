//! The fresh-run part of the simulation's BENCHMARKS.md section: 1,000,000-task runs on a
//! new and a warmed table (progress over time, floors, costs), goodput against offered
//! load, the targets met or missed, and the progress chart (docs/fresh-run.svg).

use std::fmt::Write as _;

use plotters::prelude::*;

use super::fresh::{
    Contract, GoodputRow, LOADS, RunRow, TASKS, dollars_per_million, floor_dollars_per_million,
    floor_rate,
};
use super::{Outcome, TIMELINE_BIN_S};

pub const FRESH_CHART: &str = "docs/fresh-run.svg";
/// The targets.
const WARM_TARGET_RATE: f64 = 10_000.0;
const WARM_TARGET_BY_S: f64 = 60.0;
const NEW_TARGET_RATIO: f64 = 1.25;
/// A 10 s below this share of the floor's rate then, after the first minute and while at
/// least `COLLAPSE_WORK_S` of work at that rate is left, is a collapse.
const COLLAPSE_SHARE: f64 = 0.5;
const COLLAPSE_WORK_S: f64 = 60.0;
const GOODPUT_TARGET: f64 = 0.8;

fn contract_label(contract: Contract) -> &'static str {
    match contract {
        Contract::V2 => "v2 (one task key, one prefix)",
        Contract::V3 => "v3 (16,384 keys, 256 prefixes)",
    }
}

fn row_label(row: &RunRow) -> String {
    format!("{}, {}", row.setup.label, contract_label(row.contract))
}

/// When the run completed, or why it never did (tasks dead-lettered), and when its last
/// task completed.
fn ended(outcome: &Outcome) -> String {
    if let Some(at) = outcome.completed_at {
        return format!("{at:.0} s");
    }
    let last = outcome
        .timeline
        .iter()
        .rposition(|&n| n > 0)
        .map_or(0, |b| b + 1);
    format!(
        "never: {} tasks dead-lettered (last completion by {} s)",
        outcome.dead_letters,
        last as u64 * TIMELINE_BIN_S
    )
}

/// The part, with its headings.
pub fn markdown(runs: &[RunRow], goodput: &[GoodputRow]) -> String {
    let mut md = String::from("\n### A fresh run of 1,000,000 tasks, to the run's `completed`\n\n");
    md.push_str(&targets(runs, goodput));
    md.push_str(
        "\nThe limits above one partition (docs/performance.md, *Fresh runs*): a new \
         on-demand table's 4,000 write and 12,000 read units a second (twice its busiest \
         second after each 30 minutes), physical partitions of 1,000 write units as its \
         rate implies, a hot task key split after 5 minutes hot (and again after each 5 \
         more), 3,500 PUTs a second per S3 prefix partitioned after 10 minutes hot, and the \
         event source mapping's scaling. (a): a new table, standard mode (5 invocations, \
         300 more a minute, to 1,250: 12,500 records). (b): warm throughput as \
         docs/deploying.md says for 10,000 tasks a second (50,000 write, 30,000 read units), \
         provisioned mode with 100 pollers ready and at most (1,000 invocations, 10,000 \
         records). Floor: the run's end if every capacity were used fully, nothing \
         throttled. `target/release/simulate fresh` prints this part alone.\n\n",
    );
    let _ = writeln!(
        md,
        "![completions per second of a fresh run]({FRESH_CHART})\n"
    );
    md.push_str(&runs_table(runs));
    md.push_str("\nCompletions a second, each 10 s of the first minute, then each minute:\n\n");
    md.push_str(&progress_table(runs));
    md.push_str("\n### Goodput against offered load (steady state)\n\n");
    md.push_str(
        "A fixed fleet offering 1x, 2x and 4x the hot resource's capacity (records in flight \
         = load x capacity x a task's 0.97 s), nothing else the limit; 300 s simulated, the \
         first 120 s left out. Goodput: completions a second. Throttling as modelled, a \
         request passes only if its units are there (a 1-unit claim fits where a 4-unit \
         transaction does not); two rows let any request pass while units are left \
         (the rest taken as debt), a sensitivity to that guess; the last three turn the \
         worker's pressure (each sandbox halving its records at once on a push-back, growing \
         them back by one per limit's worth counted) off, to measure it against none.\n\n",
    );
    md.push_str(&goodput_table(goodput));
    md
}

fn runs_table(runs: &[RunRow]) -> String {
    let mut md = String::from(
        "| run | completed at | floor | x floor | throttled/task | of them 503s | write units/task | read units/task | PUTs/task | $ per million tasks | task key split at (s) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in runs {
        let o = &row.outcome;
        let ratio = o
            .completed_at
            .map_or("-".into(), |at| format!("{:.2}", at / row.floor));
        let splits: Vec<String> = o.key_splits.iter().map(|s| format!("{s:.0}")).collect();
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} s | {ratio} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            row_label(row),
            ended(o),
            row.floor,
            o.throttled_per_task,
            o.slow_downs_per_task,
            o.write_units_per_task,
            o.read_units_per_task,
            o.puts_per_task,
            dollars_per_million(o),
            if splits.is_empty() {
                "-".into()
            } else {
                splits.join(", ")
            },
        );
    }
    let _ = writeln!(
        md,
        "\nThe floor of cost: one write unit and one PUT a task, ${:.3} per million tasks \
         (at $0.625 per million write units, $0.125 per million read units, $0.005 per \
         1,000 PUTs).",
        floor_dollars_per_million()
    );
    md
}

/// Completions a second over a span of the timeline (10 s bins from `from`).
fn rate(outcome: &Outcome, from: usize, bins: usize) -> f64 {
    let done: u64 = outcome.timeline.iter().skip(from).take(bins).sum();
    done as f64 / (bins as u64 * TIMELINE_BIN_S) as f64
}

fn progress_table(runs: &[RunRow]) -> String {
    let mut md = String::from("| time |");
    for row in runs {
        let _ = write!(md, " {} |", row_label(row));
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(runs.len()));
    md.push('\n');
    let longest = runs
        .iter()
        .map(|r| r.outcome.timeline.len())
        .max()
        .unwrap_or(0);
    let per_minute = (60 / TIMELINE_BIN_S) as usize;
    let mut spans: Vec<(String, usize, usize)> = (0..per_minute)
        .map(|b| (format!("{}-{} s", b * 10, b * 10 + 10), b, 1))
        .collect();
    let minutes = longest.div_ceil(per_minute).min(90);
    spans.extend((1..minutes).map(|m| (format!("minute {}", m + 1), m * per_minute, per_minute)));
    for (label, from, bins) in spans {
        let _ = write!(md, "| {label} |");
        for row in runs {
            let _ = write!(md, " {:.0} |", rate(&row.outcome, from, bins));
        }
        md.push('\n');
    }
    md
}

fn goodput_table(rows: &[GoodputRow]) -> String {
    let mut md = String::from(
        "| hot resource | throttling | worker's pressure (AIMD) | capacity (tasks/s) | offered | in flight | goodput/s | x capacity | throttled/task | write units/task |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let o = &row.outcome;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {:.0}x | {} | {:.0} | {:.2} | {:.2} | {:.2} |",
            row.hot,
            if row.debt {
                "a request passes while any units are left"
            } else {
                "a request needs its units"
            },
            if row.aimd { "on" } else { "off" },
            row.capacity,
            row.load,
            row.in_flight,
            o.completions_per_second,
            o.completions_per_second / row.capacity,
            o.throttled_per_task,
            o.write_units_per_task,
        );
    }
    md
}

/// The first time the run's 10 s rate reached `rate`, if it did.
fn reached(outcome: &Outcome, target: f64) -> Option<f64> {
    let bin = outcome
        .timeline
        .iter()
        .position(|&n| n as f64 / TIMELINE_BIN_S as f64 >= target)?;
    Some(((bin + 1) as u64 * TIMELINE_BIN_S) as f64)
}

/// The worst 10 s against the floor's rate then, after the first minute and before the
/// last minute (the run's own ramp and tail left out).
fn worst_share(row: &RunRow) -> Option<f64> {
    let fresh = super::fresh::fresh(row.setup, row.contract);
    let bins = row.outcome.timeline.len();
    let table = (
        super::capacity::NEW_TABLE_WRITE_UNITS.max(fresh.warm_write),
        super::capacity::NEW_TABLE_READ_UNITS.max(fresh.warm_read),
    );
    let timeline = &row.outcome.timeline;
    let done_before = |b: usize| timeline[..b].iter().sum::<u64>() as f64;
    (6..bins.saturating_sub(6))
        .filter_map(|b| {
            let t = (b as u64 * TIMELINE_BIN_S) as f64 + 5.0;
            let floor = floor_rate(&fresh, 10, t, table);
            // Only while a minute of work at the floor's rate is left: a run's last tasks
            // are too few to keep the capacities busy, whatever the worker does.
            let left = super::fresh::TASKS as f64 - done_before(b);
            (left >= floor * COLLAPSE_WORK_S)
                .then(|| timeline[b] as f64 / TIMELINE_BIN_S as f64 / floor)
        })
        .min_by(f64::total_cmp)
}

fn met(ok: bool) -> &'static str {
    if ok { "**met**" } else { "**missed**" }
}

/// The targets, for the v3 runs (the layout built for them) and v2 (today's).
fn targets(runs: &[RunRow], goodput: &[GoodputRow]) -> String {
    let mut md =
        String::from("Targets (the model's figures; the model was not tuned to them):\n\n");
    for row in runs.iter().filter(|r| r.setup.label.starts_with("(b)")) {
        let at = reached(&row.outcome, WARM_TARGET_RATE);
        let _ = writeln!(
            md,
            "- warmed table, {}: at least {WARM_TARGET_RATE:.0} completions a second within \
             the first minute: {} ({}; best 10 s in the first minute {:.0}/s).",
            contract_label(row.contract),
            met(at.is_some_and(|s| s <= WARM_TARGET_BY_S)),
            at.map_or("never reached".into(), |s| format!("reached by {s:.0} s")),
            (0..6).map(|b| rate(&row.outcome, b, 1)).fold(0.0, f64::max),
        );
    }
    for row in runs.iter().filter(|r| r.setup.label.starts_with("(a)")) {
        let ratio = row.outcome.completed_at.map(|at| at / row.floor);
        let worst = worst_share(row).unwrap_or(0.0);
        let _ = writeln!(
            md,
            "- new table, {}: within {NEW_TARGET_RATIO}x its capacity floor and never \
             collapsing: {} ({} against {:.0} s: {}; its worst 10 s {:.0}% of the floor's rate \
             then while a minute of work was left, a collapse below {:.0}%).",
            contract_label(row.contract),
            met(ratio.is_some_and(|r| r <= NEW_TARGET_RATIO) && worst >= COLLAPSE_SHARE),
            ended(&row.outcome),
            row.floor,
            ratio.map_or("-".into(), |r| format!("{r:.2}x")),
            worst * 100.0,
            COLLAPSE_SHARE * 100.0,
        );
    }
    let top = LOADS[LOADS.len() - 1];
    for row in goodput
        .iter()
        .filter(|r| r.load == top && !r.debt && r.aimd)
    {
        let share = row.outcome.completions_per_second / row.capacity;
        let _ = writeln!(
            md,
            "- goodput at {top:.0}x overload of {}: at least {:.0}% of capacity: {} ({:.0}%).",
            row.hot,
            GOODPUT_TARGET * 100.0,
            met(share >= GOODPUT_TARGET),
            share * 100.0,
        );
    }
    md
}

/// Completions a second (10 s bins) against minutes, a line per fresh run, log scale.
pub fn chart(runs: &[RunRow]) -> Result<String, Box<dyn std::error::Error>> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let minutes = runs
            .iter()
            .map(|r| r.outcome.timeline.len() as f64 * TIMELINE_BIN_S as f64 / 60.0)
            .fold(1.0, f64::max);
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("A fresh run of {TASKS} tasks: completions per second (simulated)"),
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0_f64..minutes, (1_f64..40_000_f64).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("minutes from the run's start")
            .y_desc("completions / s")
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (i, row) in runs.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points = row.outcome.timeline.iter().enumerate().map(|(b, &n)| {
                let minute = (b as f64 + 0.5) * TIMELINE_BIN_S as f64 / 60.0;
                (minute, (n as f64 / TIMELINE_BIN_S as f64).max(1.0))
            });
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                .label(row_label(row))
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 13))
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}
