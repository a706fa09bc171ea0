//! Rollbacks: what this release writes to items a rolling deploy shares (a task, a paid-tier
//! lease, a run's counters), read by the previous release. That release is bf0ec71. It is
//! not built here; [`PreviousReads`] lists what it reads of each item kind and the type it
//! reads it as, from its code at that commit. Each item is written by this release's own
//! code paths and then checked against that list. A field the previous release read as a
//! number but found as a string (or did not find where it required it) would be read as 0
//! or refused as corrupt by it.

use std::time::{Duration, SystemTime};

use conveyor_testkit::*;
use conveyor_worker::domain::bounds::Reason;
use conveyor_worker::domain::health::{self, Sign};
use conveyor_worker::domain::ids::RunRef;
use conveyor_worker::domain::limits::{Ask, Booker, Host, HostState, Slot};
use conveyor_worker::domain::model::{Counting, Lease, TriesFrom};
use conveyor_worker::domain::spend::{PaidLease, Reservation, Spend, TierSpend};
use conveyor_worker::ports::hosts::{HostStore, Robots, RobotsRecord};
use conveyor_worker::ports::spend::SpendStore;
use conveyor_worker::ports::tasks::TaskStore;
use conveyor_worker::store::dynamo::attributes::Item;
use conveyor_worker::store::dynamo::{DynamoTaskStore, keys};

/// How the previous release reads a field: as a string or a number (DynamoDB's S or N),
/// and whether it requires it.
#[derive(Debug, Clone, Copy)]
enum As {
    S,
    N,
    /// Required, as a string.
    RequiredS,
    /// Required, as a number.
    RequiredN,
}

/// What the previous release reads of one item kind.
struct PreviousReads(&'static [(&'static str, As)]);

/// A task item, at bf0ec71: `load_task` (its projection), `claim` (`ALL_OLD`: attempts,
/// status, url, the prior; its condition compares `lease_until` with a number and
/// `lease_owner` with a string), `claim_refused` (`lease_until`), the terminal write's
/// checks (`result_key`). `status_of` refuses a task whose status is not one of four.
const TASK: PreviousReads = PreviousReads(&[
    ("status", As::RequiredS),
    ("url", As::S),
    ("attempts", As::N),
    ("lease_owner", As::S),
    ("lease_until", As::N),
    ("prior_result_key", As::S),
    ("prior_sha256", As::S),
    ("prior_etag", As::S),
    ("prior_last_modified", As::S),
    ("result_key", As::S),
]);

/// The statuses `TaskStatus::parse` knew at bf0ec71.
const STATUSES: [&str; 4] = ["pending", "processing", "successful", "failed"];

/// A paid-tier lease item, at bf0ec71: `settle_lease` reads `reserved`, `spent` and
/// `expires_at_ms` as numbers (0 when absent) and deletes the lease only if they are still
/// those values, by its key; `reclaim_paid` compares `expires_at_ms` with now.
const PAID_LEASE: PreviousReads = PreviousReads(&[
    ("pk", As::RequiredS),
    ("sk", As::RequiredS),
    ("reserved", As::RequiredN),
    ("spent", As::N),
    ("expires_at_ms", As::RequiredN),
]);

/// A run's counter item (data contract v1), at bf0ec71: the counts, each tier's spend
/// (`proxy_requests_t<n>`, `proxy_bytes_t<n>`, `proxy_wire_bytes_t<n>` for tiers 1 to 4),
/// and the paid tier's account (`refusal`, `reserve_paid`, `return_paid`).
const RUN_COUNTERS: PreviousReads = PreviousReads(&[
    ("tasks_total", As::N),
    ("tasks_remaining", As::N),
    ("tasks_succeeded", As::N),
    ("tasks_failed", As::N),
    ("proxy_requests_t1", As::N),
    ("proxy_bytes_t1", As::N),
    ("proxy_wire_bytes_t1", As::N),
    ("proxy_requests_t2", As::N),
    ("proxy_bytes_t2", As::N),
    ("proxy_wire_bytes_t2", As::N),
    ("proxy_requests_t3", As::N),
    ("proxy_bytes_t3", As::N),
    ("proxy_wire_bytes_t3", As::N),
    ("proxy_requests_t4", As::N),
    ("proxy_bytes_t4", As::N),
    ("proxy_wire_bytes_t4", As::N),
    ("paid_tier_budget_bytes", As::N),
    ("paid_tier_reserved_bytes", As::N),
    ("paid_tier_spent_bytes", As::N),
]);

/// A host's schedule item, at bf0ec71: `host_state` reads these as numbers (absent: none),
/// and its takes compare `next_start`, `cooldown_until` and the slots with numbers. It reads
/// nothing else, so the tail, the given-back stretch and `failing_until` are ignored by it.
const HOST: PreviousReads = PreviousReads(&[
    ("next_start", As::N),
    ("slot_0", As::N),
    ("slot_1", As::N),
    ("cooldown_until", As::N),
    ("slowdown_at", As::N),
    ("cooldown_ms", As::N),
]);

impl PreviousReads {
    /// What the previous release could not read in `item`: empty when it reads it all.
    fn faults(&self, item: &Item) -> Vec<String> {
        let mut faults = Vec::new();
        for &(name, read) in self.0 {
            let value = item.get(name);
            let fault = match (read, value) {
                (As::RequiredS | As::RequiredN, None) => "missing",
                (As::S | As::RequiredS, Some(v)) if v.as_s().is_err() => "not a string",
                (As::N | As::RequiredN, Some(v)) if v.as_n().is_err() => "not a number",
                (As::N | As::RequiredN, Some(v))
                    if v.as_n().is_ok_and(|n| n.parse::<u64>().is_err()) =>
                {
                    "not a whole number"
                }
                _ => continue,
            };
            faults.push(format!("{name}: {fault} ({value:?})"));
        }
        faults
    }
}

fn store(stack: &Stack) -> DynamoTaskStore {
    DynamoTaskStore::new(stack.dynamodb.clone(), &stack.table)
}

fn now_plus(after: Duration) -> u64 {
    let at = SystemTime::now() + after;
    let at = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    at.as_millis() as u64
}

#[tokio::test]
async fn a_task_item_this_release_leased_and_marked_spent_is_read_by_the_previous_release() {
    // Arrange: a pending task.
    let stack = Stack::new().await;
    stack.put_active_run().await;
    stack
        .put_task("t1", "http://127.0.0.1:9/page", "pending")
        .await;
    let task = task_ref("t1");
    let lease = Lease {
        owner: "request-1/message-1",
        until: SystemTime::now() + Duration::from_secs(60),
    };
    let tries = TriesFrom {
        since: Some(now_ms()),
        fresh: false,
    };

    // Act: this release claims it under a lease, then marks its tries spent (a failure of
    // ours on its final attempt).
    let store = store(&stack);
    let claimed = store.claim(&task, SystemTime::now(), Some(lease), tries);
    claimed.await.expect("claimed");
    let reason = Reason::new("the proxy refused the connection");
    (store.spend_tries(&task, &reason)).await.expect("marked");
    let item = stack.task("t1").await;

    // Assert: what this release added is there, and the previous release reads the rest.
    assert!(item.n("tries_since").is_some() && item.s("tries_spent").is_some());
    assert_eq!(TASK.faults(&item.0), Vec::<String>::new(), "{item:?}");
    assert!(STATUSES.contains(&item.status().unwrap_or_default()));
}

#[tokio::test]
async fn a_paid_lease_and_run_counters_this_release_writes_are_read_by_the_previous_release() {
    // Arrange: the run with a budget for the paid tier; a delivery's spend on tiers 1 and 2.
    let stack = Stack::new().await;
    stack.put_active_run().await;
    stack.set_paid_budget(10_000_000).await;
    let (job, run) = (id(JOB), id(RUN));
    let run_ref = RunRef {
        job_id: &job,
        run_id: &run,
    };
    let lease = PaidLease {
        holder: "0123456789abcdef0123456789abcdef".into(),
        expires_at_ms: now_plus(Duration::from_secs(60)),
    };
    let mut spend = Spend::default();
    for tier in [1, 2] {
        let spent = TierSpend {
            requests: 1,
            bytes: 2_000,
            wire_bytes: 2_500,
            blocks: 1,
        };
        spend.add(tier, spent);
    }
    let store = store(&stack);

    // Act: this release reserves a chunk under its lease, notes a paid fetch on it, and
    // counts the delivery's spend on the run.
    let reserved = store.reserve_paid(run_ref, &lease, 1_048_576).await;
    assert_eq!(reserved.expect("reserved"), Reservation::Granted);
    let task = task_ref("t1");
    stack
        .put_task("t1", "http://site.test/page", "processing")
        .await;
    (store.note_paid(&task, &lease.holder, 2_500, "d1"))
        .await
        .expect("noted");
    let counted = store.record_spend(&task, Counting::Run, &spend, "d1");
    counted.await.expect("counted");

    // Assert: the previous release reads the lease and the run's counters.
    let lease_item = stack.item(keys::lease_key(&job, &run, &lease.holder)).await;
    assert_eq!(
        PAID_LEASE.faults(&lease_item.0),
        Vec::<String>::new(),
        "{lease_item:?}"
    );
    let run_item = stack.run_item(JOB, RUN).await;
    assert_eq!(
        RUN_COUNTERS.faults(&run_item.0),
        Vec::<String>::new(),
        "{run_item:?}"
    );
    assert_eq!(
        run_item.n("proxy_wire_bytes_t2"),
        Some(2_500),
        "written where it reads"
    );
}

#[test]
fn the_previous_releases_reads_find_what_its_own_items_held() {
    // Arrange: items as the previous release wrote them (`tests/fixtures/v-previous/`).
    let cases = [
        (&TASK, "task_item_leased.json"),
        (&TASK, "task_item_processing.json"),
        (&PAID_LEASE, "paid_lease_item.json"),
        (&RUN_COUNTERS, "run_item_v1_spent.json"),
        (&RUN_COUNTERS, "run_item_v1.json"),
    ];

    // Act
    let faults: Vec<_> = cases
        .iter()
        .flat_map(|(reads, name)| {
            let item = fixtures::item(&format!("v-previous/{name}"));
            reads
                .faults(&item)
                .into_iter()
                .map(move |f| format!("{name}: {f}"))
        })
        .collect();

    // Assert: the list of reads agrees with that release's own items.
    assert_eq!(faults, Vec::<String>::new());
}

#[test]
fn a_field_the_previous_release_would_misread_is_a_fault() {
    // Arrange: a lease item whose expiry is a string, and without what it reserved.
    let mut item = fixtures::item("v-previous/paid_lease_item.json");
    let expiry = conveyor_worker::store::dynamo::attributes::s("1796208735123");
    item.insert("expires_at_ms".into(), expiry);
    item.remove("reserved");

    // Act
    let faults = PAID_LEASE.faults(&item);

    // Assert
    assert_eq!(faults.len(), 2, "{faults:?}");
    assert!(faults[0].starts_with("reserved: missing"), "{faults:?}");
    assert!(
        faults[1].starts_with("expires_at_ms: not a number"),
        "{faults:?}"
    );
}

#[tokio::test]
async fn a_host_item_this_release_booked_gave_back_and_marked_failing_is_read_by_the_previous_release()
 {
    // Arrange: a host, a run of this release.
    let stack = Stack::new().await;
    let store = store(&stack);
    let host = Host::of(&url::Url::parse("http://site.test/").expect("a URL")).expect("a host");
    let booker = Booker::parse("job/cancelled").expect("ids");
    let now = now_ms();
    let booking = Ask {
        now,
        interval: Some(500),
        horizon: now + 60_000,
        slot: Some(Slot::new(1, now + 10_000)),
        slots: 2,
    };

    // Act: this release takes a start and a slot for the run, books ahead for it, gives the
    // stretch back, and records a failure (the breaker's `failing_until`).
    let seen = HostState::default();
    let (_, after, _) =
        (store.take_host(&host, &booking, &seen, Some(&booker)).await).expect("taken");
    let ahead = Ask {
        slot: None,
        ..booking
    };
    let (_, after, _) =
        (store.take_host(&host, &ahead, &after, Some(&booker)).await).expect("booked");
    let tail = after.tail.clone().expect("the run's stretch");
    let given = store.give_back(&host, &tail, now, now).await;
    assert!(given.expect("given back"), "{after:?}");
    let trouble = health::trouble(&after, (Sign::Failing, None), (now, now), Some(2.0));
    let trouble = trouble.expect("a failure is trouble");
    (store.push_back(&host, &after, trouble, now))
        .await
        .expect("recorded");
    let item = stack.host_item(host.as_str(), "HOST").await;

    // Assert: what this release added is there, and the previous release reads the rest.
    assert!(item.n("given_back_from").is_some() && item.n("failing_until").is_some());
    assert_eq!(HOST.faults(&item.0), Vec::<String>::new(), "{item:?}");
}

/// A robots.txt item, at bf0ec71: `robots_record` reads `status` (one of three) and
/// `expires_at`, `ours` and the body; `robots_take` compares `expires_at` and `lease_until`
/// with numbers. It reads nothing else, so `failures` is ignored by it.
const ROBOTS: PreviousReads = PreviousReads(&[
    ("status", As::RequiredS),
    ("expires_at", As::RequiredN),
    ("lease_until", As::N),
]);

#[tokio::test]
async fn a_robots_item_this_release_wrote_after_failures_is_read_by_the_previous_release() {
    // Arrange: a host whose robots.txt failed twice before.
    let stack = Stack::new().await;
    let store = store(&stack);
    let host = Host::of(&url::Url::parse("http://site.test/").expect("a URL")).expect("a host");
    let record = RobotsRecord {
        rules: Robots::Unavailable,
        expires_at: now_plus(Duration::from_secs(240)),
        failures: 3,
    };

    // Act: this release stores the failure, as its fleet fetch does.
    store.put_robots(&host, record).await.expect("stored");
    let item = stack.host_item(host.as_str(), "ROBOTS").await;

    // Assert: the count is there, and the previous release reads the rest as a failure.
    assert_eq!(item.n("failures"), Some(3));
    assert_eq!(item.s("status"), Some("unavailable"));
    assert_eq!(ROBOTS.faults(&item.0), Vec::<String>::new(), "{item:?}");
    let read = store.robots(&host).await.expect("read").expect("the item");
    assert_eq!(read.failures, 3, "this release reads its own count");
}
