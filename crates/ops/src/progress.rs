//! `conveyor-ops progress`: a run's status and counters as stored, its tasks counted by
//! status from the tasks themselves, and why its failed tasks failed.

use std::collections::BTreeMap;

use conveyor_worker::domain::ids::Id;
use conveyor_worker::domain::model::Counting;
use conveyor_worker::domain::spend::{MAX_TIERS, Spend, TierSpend};
use conveyor_worker::ports::error::StoreError;
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::dynamo::attributes::{Item, number, string, text};
use conveyor_worker::store::dynamo::runs::counting_of;
use conveyor_worker::store::dynamo::spend::{blocks_name, spend_names};

/// A run as stored, and its tasks by status.
#[derive(Debug, Default, serde::Serialize)]
pub struct RunProgress {
    /// The run item's attributes that tell its progress (status, counters, times).
    pub run: BTreeMap<String, String>,
    /// Tasks counted by status, from the tasks themselves.
    pub by_status: BTreeMap<String, u64>,
    /// Failed tasks: (task id, error).
    pub failures: Vec<(String, String)>,
    /// Tasks not ended yet: (task id, status), at most [`MOST_STUCK`].
    pub open: Vec<(String, String)>,
}

/// The most open tasks a progress keeps the ids of.
pub const MOST_STUCK: usize = 20;

impl RunProgress {
    /// Tasks in the run, by the tasks themselves.
    pub fn total(&self) -> u64 {
        self.by_status.values().sum()
    }

    /// Tasks that reached their end.
    pub fn finished(&self) -> u64 {
        ["successful", "failed"]
            .iter()
            .filter_map(|s| self.by_status.get(*s))
            .sum()
    }

    /// Where the run item's count of tasks left and its tasks disagree, a note on why that
    /// can happen.
    pub fn disagreement(&self) -> Option<String> {
        let remaining: u64 = self.run.get("tasks_remaining")?.parse().ok()?;
        let open = self.total() - self.finished();
        (remaining != open).then(|| {
            format!(
                "the run counts {remaining} tasks remaining, its tasks say {open} not ended: \
                 {}",
                if remaining > open {
                    "counts still on their way to the run (v2 shards), or a task ended \
                     without being counted"
                } else {
                    "tasks added or re-queued since the run was counted"
                }
            )
        })
    }

    /// The run ended (completed, cancelled, failed), or, for a run without counters, has no
    /// task left to end. A counted run is followed until its status says it ended. Its tasks
    /// are read after its item, and in v2 the count climbs to the run one transaction at a
    /// time. So every task can be seen ended while the run is still, rightly, `running`.
    pub fn ended(&self) -> bool {
        let counted = self.run.contains_key("tasks_remaining");
        match self.run.get("status").map(String::as_str) {
            Some("running") if counted => false,
            Some("running") | None => self.total() > 0 && self.finished() == self.total(),
            Some(_) => true,
        }
    }
}

/// The run item's attributes that tell its progress.
const RUN_FIELDS: [&str; 18] = [
    "status",
    "counter_shards",
    "counter_groups",
    "groups_remaining",
    "shards_remaining",
    "tasks_total",
    "tasks_remaining",
    "tasks_succeeded",
    "tasks_failed",
    "times_completed",
    "created_at",
    "updated_at",
    "completed_at",
    "paid_tier_budget_bytes",
    "paid_tier_reserved_bytes",
    "refreshes",
    "pages_not_modified",
    "bytes_not_fetched",
];

/// The run item and every task of the run (one Query, paged).
pub async fn progress(
    tasks: &DynamoTaskStore,
    job: &Id,
    run: &Id,
) -> Result<RunProgress, StoreError> {
    let mut progress = RunProgress {
        run: run_fields(tasks, job, run).await?,
        ..RunProgress::default()
    };
    for (task, item) in tasks.run_tasks(job, run).await? {
        let status = string(&item, "status").unwrap_or_default().to_owned();
        if status == "failed" {
            let error = string(&item, "error").unwrap_or_default().to_owned();
            progress.failures.push((task, error));
        } else if status != "successful" && progress.open.len() < MOST_STUCK {
            progress.open.push((task, status.clone()));
        }
        *progress.by_status.entry(status).or_default() += 1;
    }
    Ok(progress)
}

/// The run item's progress attributes, as text. For a run counted in shards, the shards'
/// counters are added up. An error when the run does not exist.
pub async fn run_fields(
    tasks: &DynamoTaskStore,
    job: &Id,
    run: &Id,
) -> Result<BTreeMap<String, String>, StoreError> {
    let item: Item = tasks
        .run_item(job, run)
        .await?
        .ok_or_else(|| StoreError::NotAllowed {
            detail: format!("run {job}/{run} does not exist"),
        })?;
    let mut fields: BTreeMap<String, String> = RUN_FIELDS
        .iter()
        .filter_map(|f| Some((f.to_string(), text(item.get(*f)?)?)))
        .collect();
    let mut counters = vec![item.clone()];
    if let Some(Counting::Shards(sharding)) = counting_of(&item) {
        let shards = tasks.shard_items(job, run, sharding.shards).await?;
        for (counter, sum) in shard_sums(&shards) {
            if sum > 0 || counter.starts_with("tasks_") {
                fields.insert(counter.into(), sum.to_string());
            }
        }
        counters.extend(shards);
    }
    let spend = spend_of(&counters);
    for (tier, spent) in spend.spent() {
        let [requests, bytes, wire] = spend_names(tier);
        fields.insert(requests, spent.requests.to_string());
        fields.insert(bytes, spent.bytes.to_string());
        fields.insert(wire, spent.wire_bytes.to_string());
    }
    let blocks = spend.spent().map(|(tier, spent)| (tier, spent.blocks));
    for (tier, blocks) in blocks.chain([(0, spend.direct_blocks())]) {
        if blocks > 0 {
            fields.insert(blocks_name(tier), blocks.to_string());
        }
    }
    if spend.blocks() > 0 {
        fields.insert("blocks".into(), spend.blocks().to_string());
    }
    Ok(fields)
}

/// What a run spent through each proxy tier: on its run item (v1) or its shards (v2).
pub fn spend_of(counters: &[Item]) -> Spend {
    let mut spend = Spend::default();
    for item in counters {
        for tier in 1..=MAX_TIERS {
            let [requests, bytes, wire] = spend_names(tier).map(|name| number(item, &name));
            let spent = TierSpend {
                requests: requests.unwrap_or(0),
                bytes: bytes.unwrap_or(0),
                wire_bytes: wire.unwrap_or(0),
                blocks: number(item, &blocks_name(tier)).unwrap_or(0),
            };
            spend.add(tier, spent);
        }
        spend.add_direct_blocks(number(item, &blocks_name(0)).unwrap_or(0));
    }
    spend
}

/// The counters of a run's shards, added up.
fn shard_sums(shards: &[Item]) -> [(&'static str, u64); 5] {
    [
        "tasks_remaining",
        "tasks_succeeded",
        "tasks_failed",
        "pages_not_modified",
        "bytes_not_fetched",
    ]
    .map(|counter| {
        let sum = shards
            .iter()
            .filter_map(|s| number::<u64>(s, counter))
            .sum();
        (counter, sum)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(run: &[(&str, &str)], by_status: &[(&str, u64)]) -> RunProgress {
        let owned = |(k, v): &(&str, &str)| (k.to_string(), v.to_string());
        RunProgress {
            run: run.iter().map(owned).collect(),
            by_status: by_status.iter().map(|(s, n)| (s.to_string(), *n)).collect(),
            failures: Vec::new(),
            open: Vec::new(),
        }
    }

    #[test]
    fn a_counted_run_has_ended_only_when_its_status_says_so() {
        let all_done = [("successful", 2)];
        let counting = [("status", "running"), ("tasks_remaining", "1")];
        let completed = [("status", "completed"), ("tasks_remaining", "0")];

        assert!(!progress(&counting, &all_done).ended());
        assert!(progress(&completed, &all_done).ended());
        assert!(progress(&[("status", "cancelled")], &[("pending", 2)]).ended());
    }

    #[test]
    fn a_run_without_counters_has_ended_when_every_task_has() {
        let running = [("status", "running")];

        assert!(progress(&running, &[("successful", 1), ("failed", 1)]).ended());
        assert!(!progress(&running, &[("successful", 1), ("processing", 1)]).ended());
        assert!(!progress(&running, &[]).ended());
    }
}
