//! The chaos run: 500 tasks per duplicate policy through the local event source mapping,
//! with messages sent more than once, AWS faults and latency on a share of DynamoDB, S3 and
//! SQS calls, crashes between the S3 write and the terminal write, and flaky, slow and failing pages.
//! It asserts, and prints as figures, that every task ends exactly once (or its message is in
//! the dead-letter queue), that the run's counters equal the task states and the run completed
//! exactly once, that every stored result matches its task, and that no message was lost;
//! under both duplicate policies, with fetches per task compared. The converge run counts
//! in a counter tree of 8 shards in 3 groups (data contract v2), the lease run on its run
//! item (v1); the tree's every count must add up. The worker meets AWS
//! through the production-like layer (`scripts/prodlike.py`): transactions on the run item
//! overlap and are cancelled, reads may be stale, S3 answers 409 to racing PUTs.
//! `CHAOS_TASKS=N` changes the number of tasks per policy.

use std::time::Duration;

use conveyor_testkit::chaos::Faults;
use conveyor_testkit::scenario::{self, Scenario};
use conveyor_worker::wiring::config::DuplicatePolicy;

fn scenario(policy: DuplicatePolicy, counters: (u32, u32), polite: bool) -> Scenario {
    Scenario {
        tasks: std::env::var("CHAOS_TASKS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(500),
        policy,
        faults: Some(Faults {
            error_rate: 0.03,
            slow_rate: 0.10,
            delay: Duration::from_millis(30),
        }),
        crash_rate: 0.03,
        production_like: true,
        counters,
        polite,
        ..Scenario::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_ends_once_and_every_count_adds_up_under_chaos() {
    // The injected crashes are expected: keep them out of the output, and nothing else.
    conveyor_testkit::chaos::quiet_injected_crashes();
    let (converge, lease) = tokio::join!(
        // The converge run at politeness's production defaults, over local hosts; the lease
        // run without host limits, on one site: it presses the run item's transactions
        // into conflicts as hard as the fleet can.
        scenario::run(scenario(DuplicatePolicy::Converge, (8, 3), true)),
        scenario::run(scenario(DuplicatePolicy::Lease, (0, 0), false))
    );

    for report in [&converge, &lease] {
        println!("chaos {}\n  {}", report.line(), report.counters);
        // Most tasks end: the injected faults are rare enough for five receives.
        assert!(
            report.successful + report.failed >= report.total * 9 / 10,
            "{report:?}"
        );
    }
    // Production's conflicts really happened (the v1 run finishes into one run item).
    let conflicts = converge.conflicts.unwrap_or(0) + lease.conflicts.unwrap_or(0);
    assert!(
        conflicts > 0,
        "no conflict met: the run proves nothing about them"
    );
}
