//! The simulation's part of BENCHMARKS.md: one run's completions per second against tasks in
//! flight for each way of counting (a table and docs/run-progress.svg), the model's guesses
//! varied, whole runs to their end, and fresh runs under the limits above a partition
//! (`fresh`, `fresh_report`).

use std::fmt::Write as _;

use conveyor_ops::submit::sharding;
use conveyor_worker::domain::model::Sharding;
use plotters::prelude::*;
use rayon::prelude::*;

use super::fresh::{self, GoodputRow, RunRow};
use super::{Counting, Outcome, Params, fresh_report, simulate};

/// The section's bounds in BENCHMARKS.md (the rest of it is `bench`'s).
pub const BEGIN: &str = "<!-- run-progress: written by `make bench` (target/release/simulate) -->";
pub const END: &str = "<!-- /run-progress -->";
pub const CHART: &str = "docs/run-progress.svg";

/// Tasks in flight on the run, the sweep's x axis.
pub const IN_FLIGHT: [u32; 8] = [10, 100, 1_000, 2_000, 4_000, 8_000, 16_000, 20_000];
/// The target: one run at 16,000 in flight.
const TARGET_IN_FLIGHT: u32 = 16_000;
const TARGET_RATE: f64 = 10_000.0;
const TARGET_CONFLICTS: f64 = 0.01;

/// The ways of counting compared: the run item (v1), shards alone, and counter trees.
pub const COUNTINGS: [Counting; 5] = [
    Counting::RunItem,
    Counting::Shards {
        shards: 16,
        groups: 0,
    },
    Counting::Shards {
        shards: 256,
        groups: 0,
    },
    Counting::Shards {
        shards: 4_096,
        groups: 64,
    },
    Counting::Shards {
        shards: 16_384,
        groups: 256,
    },
];
/// Whole runs: their sizes, counted on the run item and as `conveyor-ops submit` would.
const RUN_SIZES: [u64; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// One simulated situation and what it gave.
#[derive(Debug, Clone)]
pub struct Row {
    pub label: String,
    pub params: Params,
    pub outcome: Outcome,
    /// A whole run's end without DynamoDB's limits: each task taking its own time alone.
    pub floor: Option<f64>,
}

/// Everything the section shows.
#[derive(Debug, Clone)]
pub struct Report {
    pub sweep: Vec<Row>,
    pub variations: Vec<Row>,
    pub whole_runs: Vec<Row>,
    pub fresh_runs: Vec<RunRow>,
    pub goodput: Vec<GoodputRow>,
}

/// Runs every simulation (in parallel: each is independent and seeded).
/// All parts at once, so that the longest (fresh runs) overlap the rest.
pub fn run() -> Report {
    let sweep = COUNTINGS
        .iter()
        .flat_map(|&counting| IN_FLIGHT.map(|in_flight| steady(counting, in_flight)))
        .collect();
    let ((fresh_runs, goodput), (sweep, (variations, whole_runs))) = rayon::join(
        || rayon::join(fresh::runs, fresh::goodput),
        || {
            rayon::join(
                || simulated(sweep),
                || {
                    rayon::join(
                        || simulated(variations()),
                        || with_floors(simulated(whole_runs())),
                    )
                },
            )
        },
    );
    Report {
        sweep,
        variations,
        whole_runs,
        fresh_runs,
        goodput,
    }
}

fn with_floors(rows: Vec<Row>) -> Vec<Row> {
    rows.into_par_iter()
        .map(|row| {
            let unlimited = Params {
                limits: false,
                ..row.params.clone()
            };
            Row {
                floor: simulate(&unlimited).completed_at,
                ..row
            }
        })
        .collect()
}

fn simulated(situations: Vec<(String, Params)>) -> Vec<Row> {
    situations
        .into_par_iter()
        .map(|(label, params)| Row {
            outcome: simulate(&params),
            floor: None,
            label,
            params,
        })
        .collect()
}

fn steady(counting: Counting, in_flight: u32) -> (String, Params) {
    let params = Params {
        in_flight,
        counting,
        ..Params::default()
    };
    (counting_label(counting), params)
}

/// The model's guesses varied around the target situation.
fn variations() -> Vec<(String, Params)> {
    let tree = Counting::Shards {
        shards: 16_384,
        groups: 256,
    };
    let (_, base) = steady(tree, TARGET_IN_FLIGHT);
    let mut rows: Vec<(String, Params)> = [2.0, 5.0, 10.0, 20.0]
        .into_iter()
        .map(|hold_ms| {
            let label = format!("a transaction holds its items {hold_ms} ms");
            (
                label,
                Params {
                    hold_ms,
                    ..base.clone()
                },
            )
        })
        .collect();
    let no_cache = Params {
        parents_ttl_ms: None,
        ..base.clone()
    };
    rows.push((
        "the job and run read for every task (no cache)".into(),
        no_cache,
    ));
    for partitions in [4, 16] {
        let label = format!("the tasks' items on {partitions} partitions, not yet split");
        let params = Params {
            task_partitions: Some(partitions),
            ..base.clone()
        };
        rows.push((label, params));
    }
    rows
}

/// Whole runs: each size on the run item and as submitted by default; the largest also in
/// shards without groups (their last tasks all write the run item at the end).
fn whole_runs() -> Vec<(String, Params)> {
    let largest = RUN_SIZES[RUN_SIZES.len() - 1];
    let no_groups = Counting::Shards {
        shards: 16_384,
        groups: 0,
    };
    let mut runs: Vec<(String, Params)> = RUN_SIZES
        .into_iter()
        .flat_map(|tasks| {
            let tree = match sharding(tasks, None, None) {
                Some(Sharding { shards, groups }) => Counting::Shards { shards, groups },
                None => Counting::RunItem,
            };
            [Counting::RunItem, tree].map(|counting| whole_run(tasks, counting))
        })
        .collect();
    runs.push(whole_run(largest, no_groups));
    runs
}

fn whole_run(tasks: u64, counting: Counting) -> (String, Params) {
    let params = Params {
        in_flight: TARGET_IN_FLIGHT,
        counting,
        tasks: Some(tasks),
        seconds: 100_000.0,
        warmup: 0.0,
        ..Params::default()
    };
    (counting_label(counting), params)
}

fn counting_label(counting: Counting) -> String {
    match counting {
        Counting::RunItem => "run item (v1)".into(),
        Counting::Shards { shards, groups: 0 } => format!("{shards} shards"),
        Counting::Shards { shards, groups } => format!("{shards} shards, {groups} groups"),
    }
}

/// The section, markers included.
pub fn markdown(report: &Report) -> String {
    let mut md = format!("{BEGIN}\n## One run at fleet speed (simulated)\n\n");
    md.push_str(&verdict(report));
    md.push_str(
        "\nA discrete-event model of DynamoDB (1,000 write and 3,000 read units a second per \
         partition, transactions at twice the cost, a transaction cancelling any other that \
         overlaps one of its items while it holds them) fed with the worker's requests per \
         task as the tests count them. Steady state: 40 s simulated, the first 10 s left out. \
         docs/performance.md says what the model assumes and where it could be wrong.\n\n",
    );
    let _ = writeln!(md, "![completions per second of one run]({CHART})\n");
    md.push_str(&sweep_table(&report.sweep));
    md.push_str(
        "\n### The model's guesses varied (16,384 shards, 256 groups, 16,000 in flight)\n\n",
    );
    md.push_str(&rows_table(&report.variations, false));
    md.push_str("\n### Whole runs at 16,000 in flight, to the run's `completed`\n\n");
    md.push_str(
        "Each size counted on the run item, and as `conveyor-ops submit` counts it by \
         default. Floor: the same run without DynamoDB's limits, each task taking its own \
         time alone (pages of 0.8 s median, the fleet ramping up over its first second).\n\n",
    );
    md.push_str(&rows_table(&report.whole_runs, true));
    md.push_str(&fresh_report::markdown(&report.fresh_runs, &report.goodput));
    md.push_str(END);
    md.push('\n');
    md
}

/// The target's line: met or not, with the figures.
fn verdict(report: &Report) -> String {
    let at_target = report.sweep.iter().filter(|r| {
        r.params.in_flight == TARGET_IN_FLIGHT && r.params.counting != Counting::RunItem
    });
    let best = at_target
        .filter(|r| r.outcome.conflict_rate < TARGET_CONFLICTS)
        .max_by(|a, b| {
            a.outcome
                .completions_per_second
                .total_cmp(&b.outcome.completions_per_second)
        });
    match best {
        Some(row) if row.outcome.completions_per_second >= TARGET_RATE => format!(
            "Target (at least {TARGET_RATE:.0} completions a second for one run at \
             {TARGET_IN_FLIGHT} in flight, under 1% conflicts): **met** by {}: {:.0}/s, \
             {:.2}% conflicts.\n",
            row.label,
            row.outcome.completions_per_second,
            row.outcome.conflict_rate * 100.0
        ),
        _ => format!(
            "Target (at least {TARGET_RATE:.0} completions a second for one run at \
             {TARGET_IN_FLIGHT} in flight, under 1% conflicts): **not met**.\n"
        ),
    }
}

fn sweep_table(rows: &[Row]) -> String {
    let mut md = String::from(
        "Completions per second (conflicts: transactions cancelled of those tried).\n\n| counting |",
    );
    for n in IN_FLIGHT {
        let _ = write!(md, " {n} in flight |");
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(IN_FLIGHT.len()));
    md.push('\n');
    for counting in COUNTINGS {
        let _ = write!(md, "| {} |", counting_label(counting));
        for row in rows.iter().filter(|r| r.params.counting == counting) {
            let o = &row.outcome;
            let _ = write!(
                md,
                " {:.0}/s, {:.2}% |",
                o.completions_per_second,
                o.conflict_rate * 100.0
            );
        }
        md.push('\n');
    }
    md
}

fn rows_table(rows: &[Row], whole: bool) -> String {
    let mut md = String::from(
        "| situation | tasks | completions/s | conflicts | throttled/task | requests/task | job partition reads/s |",
    );
    md.push_str(if whole {
        " completed at | floor |\n"
    } else {
        "\n"
    });
    md.push_str("|---|---|---|---|---|---|---|");
    md.push_str(if whole { "---|---|\n" } else { "\n" });
    for row in rows {
        let o = &row.outcome;
        let tasks = row.params.tasks.map_or("endless".into(), |t| t.to_string());
        let _ = write!(
            md,
            "| {} | {tasks} | {:.0} | {:.2}% | {:.2} | {:.2} | {:.0} |",
            row.label,
            o.completions_per_second,
            o.conflict_rate * 100.0,
            o.throttled_per_task,
            o.requests_per_task,
            o.job_reads_per_second,
        );
        if whole {
            let seconds = |s: Option<f64>| s.map_or("not in time".into(), |s| format!("{s:.1} s"));
            let completed = match (o.completed_at, o.dead_letters) {
                (None, dead) if dead > 0 => format!("never: {dead} dead-lettered"),
                (at, _) => seconds(at),
            };
            let _ = write!(md, " {completed} | {} |", seconds(row.floor));
        }
        md.push('\n');
    }
    md
}

/// `doc` with its section replaced by `section` (appended when it has none).
pub fn splice(doc: &str, section: &str) -> String {
    match (doc.find(BEGIN), doc.find(END)) {
        (Some(begin), Some(end)) if begin < end => {
            let after = &doc[end + END.len()..];
            let after = after.strip_prefix('\n').unwrap_or(after);
            format!("{}{section}{after}", &doc[..begin])
        }
        _ => format!(
            "{}\n{section}",
            doc.trim_end_matches('\n').to_owned() + "\n"
        ),
    }
}

/// The section of `doc`, if it has one (what `bench` keeps when it rewrites the rest).
pub fn section(doc: &str) -> Option<&str> {
    let begin = doc.find(BEGIN)?;
    let end = doc[begin..].find(END)? + begin + END.len();
    Some(&doc[begin..end])
}

/// Completions per second against tasks in flight, log-log, a line per way of counting.
pub fn chart(rows: &[Row]) -> Result<String, Box<dyn std::error::Error>> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "One run: completions per second (simulated)",
                ("sans-serif", 22),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (10_f64..20_000_f64).log_scale(),
                (1_f64..40_000_f64).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("tasks in flight")
            .y_desc("completions / s")
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        let target = [(10.0, TARGET_RATE), (20_000.0, TARGET_RATE)];
        chart
            .draw_series(LineSeries::new(target, BLACK.mix(0.4)))?
            .label("target: 10,000/s")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.4)));
        for (i, counting) in COUNTINGS.into_iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.params.counting == counting)
                .map(|r| {
                    (
                        f64::from(r.params.in_flight),
                        r.outcome.completions_per_second.max(1.0),
                    )
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(counting_label(counting))
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 15))
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_is_replaced_in_place_and_appended_when_missing() {
        let old = format!("# B\n\ntext\n{BEGIN}\nold\n{END}\nafter\n");
        let new = format!("{BEGIN}\nnew\n{END}\n");

        let replaced = splice(&old, &new);
        let appended = splice("# B\n", &new);

        assert_eq!(
            replaced,
            format!("# B\n\ntext\n{BEGIN}\nnew\n{END}\nafter\n")
        );
        assert_eq!(appended, format!("# B\n\n{new}"));
        assert_eq!(section(&replaced), Some(new.trim_end()));
    }
}
