//! Upgrades: items an earlier release wrote, kept under `tests/fixtures/` as it wrote them,
//! are put in the table and read by this worker as that release meant them. A fixture of
//! another item kind needs a file and a test here; `put_fixture` moves it to the test's
//! own keys and times. The other direction (rollbacks) is `previous_release`.

use std::time::{Duration, SystemTime};

use conveyor_ops::progress::spend_of;
use conveyor_testkit::fixtures;
use conveyor_testkit::polite_site::{Behaviour, PoliteSite};
use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;
use conveyor_worker::domain::ids::{Id, RunRef, TaskRef};
use conveyor_worker::domain::model::Counting;
use conveyor_worker::domain::spend::{Spend, TierSpend};
use conveyor_worker::domain::time::rfc3339;
use conveyor_worker::polite::Politeness;
use conveyor_worker::polite::limits::HostLimits;
use conveyor_worker::ports::spend::SpendStore;
use conveyor_worker::store::dynamo::attributes::{self, Item};
use conveyor_worker::store::dynamo::{DynamoTaskStore, keys};
use conveyor_worker::wiring::config::DuplicatePolicy;

use crate::ops::{ops, succeeded};

const DAY: Duration = Duration::from_secs(86_400);

/// Puts the item of `tests/fixtures/<name>` in the table once `change` has moved it to the
/// test's keys and times (or taken something from it); answers it as put.
async fn put_fixture(stack: &Stack, name: &str, change: impl FnOnce(&mut Item)) -> Item {
    let mut item = fixtures::item(name);
    change(&mut item);
    stack.put_item(item.clone()).await;
    item
}

/// The key of `site`'s host item `sk`, and each named time set to now plus its offset.
fn on_host(site: &PoliteSite, sk: &str, times: &[(&str, Duration)]) -> Item {
    let mut item = keys::host_key(&host_of(site), sk);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    for (name, after) in times {
        let at = (now + *after).as_millis() as u64;
        item.insert((*name).to_owned(), attributes::n(at));
    }
    item
}

/// `name:port`, as the worker keys its host.
fn host_of(site: &PoliteSite) -> String {
    site.url("").trim_start_matches("http://").to_owned()
}

/// robots.txt obeyed, limits that do not bind.
fn polite() -> Politeness {
    Politeness {
        limits: HostLimits {
            max_rps: Some(50.0),
            max_inflight: Some(8),
        },
        obey_robots: true,
        agent: "conveyor-worker".into(),
        ..Politeness::off()
    }
}

/// Tasks `t0` (`/page/0`) and `t1` (`/private/1`) on `site`, of an active run, delivered
/// once to a polite worker; the reply's retried ids.
async fn page_and_private(stack: &Stack, site: &PoliteSite) -> Vec<String> {
    stack.put_active_run().await;
    stack.put_task("t0", &site.url("/page/0"), "pending").await;
    stack
        .put_task("t1", &site.url("/private/1"), "pending")
        .await;
    let worker = stack.worker_with(|t| t.politeness = polite());
    retried(&run_batch(&worker, vec![delivery("t0"), delivery("t1")]).await)
}

#[tokio::test]
async fn a_robots_item_the_last_release_wrote_is_obeyed_without_fetching_robots_txt_again() {
    // Arrange: the host's robots.txt as the last release kept it (whole, in `body`), fresh
    // for another day, disallowing /private; the site's own robots.txt (404) allows all.
    let stack = Stack::new().await;
    let site = PoliteSite::start(Behaviour::default()).await;
    let kept = on_host(&site, "ROBOTS", &[("expires_at", DAY)]);
    put_fixture(&stack, "v-previous/robots_item_body.json", |item| {
        item.extend(kept)
    })
    .await;

    // Act
    let retried = page_and_private(&stack, &site).await;

    // Assert: each task ended at its first delivery, as the kept file says.
    assert!(retried.is_empty(), "{retried:?}");
    assert_eq!(stack.task("t0").await.status(), Some("successful"));
    let private = stack.task("t1").await;
    assert_eq!(private.s("error"), Some("disallowed by robots.txt"));
    assert_eq!(site.hits("/private"), 0);
    assert_eq!(
        site.hits("/robots.txt"),
        0,
        "the kept copy read, not fetched"
    );
}

#[tokio::test]
async fn a_robots_item_that_cannot_be_read_is_fetched_again_at_once_not_waited_out() {
    // Arrange: a robots item of the last release's shape without its body (no release reads
    // it), fresh for another day.
    let stack = Stack::new().await;
    let site = PoliteSite::start(Behaviour::default()).await;
    let kept = on_host(&site, "ROBOTS", &[("expires_at", DAY)]);
    put_fixture(&stack, "v-previous/robots_item_body.json", |item| {
        item.extend(kept);
        item.remove("body");
    })
    .await;

    // Act: the batch; a record its host's schedule held back (a wait of moments on a
    // loaded machine) delivered again a second later.
    let held = page_and_private(&stack, &site).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again: Vec<_> = held.iter().map(|t| delivery(t)).collect();
    let worker = stack.worker_with(|t| t.politeness = polite());
    let still = retried(&run_batch(&worker, again).await);

    // Assert: robots.txt fetched again (404: everything allowed) and kept anew; no task
    // waited for the unreadable item to expire (a day).
    assert!(still.is_empty(), "{held:?}, then {still:?}");
    assert_eq!(site.hits("/robots.txt"), 1);
    assert_eq!(stack.task("t0").await.status(), Some("successful"));
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    let robots = stack.host_item(&host_of(&site), "ROBOTS").await;
    assert_eq!(robots.s("status"), Some("allow_all"));
}

#[tokio::test]
async fn a_host_item_the_last_release_wrote_keeps_its_cooldown() {
    // Arrange: the host's item as the last release wrote it (schedule, a lapsed slot, a
    // slowdown), cooling down for another minute.
    let stack = Stack::new().await;
    let site = PoliteSite::start(Behaviour::default()).await;
    let cooling = on_host(
        &site,
        "HOST",
        &[("cooldown_until", Duration::from_secs(60))],
    );
    put_fixture(&stack, "v-previous/host_item.json", |item| {
        item.extend(cooling)
    })
    .await;

    // Act
    page_and_private(&stack, &site).await;

    // Assert: nothing fetched from the host, no task claimed.
    assert_eq!(site.hits("/"), 0, "no request, robots.txt's included");
    assert_eq!(stack.task("t0").await.status(), Some("pending"));
    assert_eq!(stack.task("t1").await.status(), Some("pending"));
}

#[tokio::test]
async fn a_task_the_last_release_was_trying_counts_on_from_its_attempts() {
    // Arrange: a v1 run and a task the last release claimed four times (no `tries_since`),
    // the last just now, its page down; the producer's message, as SQS delivers it (with
    // its SentTimestamp).
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_job(JOB, "active").await;
    put_fixture(&stack, "v-previous/run_item_v1.json", |item| {
        item.extend(keys::run_key(&id(JOB), &id(RUN)));
    })
    .await;
    let url = attributes::s(&site.url("/down/1"));
    put_fixture(&stack, "v-previous/task_item_processing.json", |item| {
        item.extend(keys::task_key(&task_ref("t1")));
        item.insert("url".into(), url);
        item.insert(
            "updated_at".into(),
            attributes::s(&rfc3339(SystemTime::now())),
        );
    })
    .await;
    let queue = Queue::create(&stack, 60).await;
    queue.send(&stack, &body("t1")).await;
    let record = queue.receive(&stack).await.expect("the message");

    // Act
    let reply = run_batch(&stack.worker(), vec![record]).await;

    // Assert: its fifth try was its last (failed, the run counted and completed), and the
    // task now keeps when its tries began.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("failed"), "{task:?}");
    assert_eq!(task.n("attempts"), Some(5));
    assert!(task.n("tries_since").is_some(), "{task:?}");
    assert_eq!(stack.run_counters(JOB, RUN).await, (0, 1, 0));
    assert_eq!(site.hits("/down/1"), 1);
}

/// The item of a task whose tries were spent an hour ago, at `url`: as the last release left
/// it (no `tries_since`), or as this one does (`tries_since`, and `tries_spent` for a failure
/// of ours on the final attempt).
async fn spent_an_hour_ago(stack: &Stack, task: &str, url: &str, this_release: bool) {
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3_600);
    put_fixture(stack, "v-previous/task_item_processing.json", |item| {
        item.extend(keys::task_key(&task_ref(task)));
        item.insert("url".into(), attributes::s(url));
        item.insert("attempts".into(), attributes::n(MAX_ATTEMPTS));
        item.insert("updated_at".into(), attributes::s(&rfc3339(an_hour_ago)));
        if this_release {
            let since = an_hour_ago.duration_since(SystemTime::UNIX_EPOCH);
            let since = since.unwrap_or_default().as_millis();
            item.insert("tries_since".into(), attributes::n(since));
            item.insert("tries_spent".into(), attributes::s("SQS throttled"));
        }
    })
    .await;
}

/// Receives `queue`'s messages one at a time, each delivered to a worker, until `tasks`
/// have all ended (or a dozen deliveries).
async fn drain_until_ended(stack: &Stack, queue: &Queue, tasks: &[&str]) {
    let worker = stack.worker();
    for _ in 0..12 {
        let (record, _) = (queue.wait_for_redelivery(stack, Duration::from_secs(40))).await;
        run_batch(&worker, vec![record]).await;
        let mut ended = true;
        for task in tasks {
            let status = stack.task(task).await.status().map(str::to_owned);
            ended &= matches!(status.as_deref(), Some("successful" | "failed"));
        }
        if ended {
            return;
        }
    }
}

#[tokio::test]
async fn a_redrive_move_gives_tasks_of_either_release_a_full_set_of_tries() {
    // Arrange: two tasks whose tries were spent an hour ago, one as the last release left
    // it, one as this release does; each page answers 503 twice, then the page. Their
    // producers' messages are in the dead-letter queue.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    let tasks = [("previous", "/flaky/a", false), ("this", "/flaky/b", true)];
    for (task, path, this_release) in tasks {
        spent_an_hour_ago(&stack, task, &site.url(path), this_release).await;
    }
    let dlq = Queue::create(&stack, 30).await;
    let queue = Queue::create_with_dlq(&stack, 30, &dlq, 10).await;
    for (task, ..) in tasks {
        dlq.send(&stack, &body(task)).await;
    }

    // Act: `conveyor-ops redrive --move`, then the task queue's receives until both end.
    let redrive = ["redrive", "--queue-url", queue.url.as_str(), "--move"];
    succeeded(&ops(&stack, &redrive).await);
    drain_until_ended(&stack, &queue, &["previous", "this"]).await;

    // Assert: each page's two 503s were retried, not a final attempt's failure: a fresh set
    // of three tries each.
    for (task, path, _) in tasks {
        let item = stack.task(task).await;
        assert_eq!(item.status(), Some("successful"), "{task}: {item:?}");
        assert_eq!(item.n("attempts"), Some(3), "{task}: {item:?}");
        assert_eq!(item.s("tries_spent"), None, "{task}");
        assert_eq!(site.hits(path), 3, "{task}");
    }
}

#[tokio::test]
async fn runs_of_v2_and_v3_the_last_release_submitted_drain_to_one_completion_each() {
    // Arrange: each run's items as `conveyor-ops submit` wrote them (two tasks, two counter
    // shards, one group; v3 spread over the shards), their tasks and producers' messages.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let mut records = Vec::new();
    for (version, job, run, spread) in [
        ("v2", "job-2", "run-2", None),
        ("v3", "job-3", "run-3", Some(2)),
    ] {
        stack.put_job(job, "active").await;
        for item in ["run", "group_0", "shard_0", "shard_1"] {
            put_fixture(&stack, &format!("v-previous/{version}_{item}.json"), |_| {}).await;
        }
        for task in ["task-1", "task-2"] {
            let task = TaskRef {
                spread,
                ..task_ref_in(job, run, task)
            };
            stack
                .put_task_of(&task, &site.url("/page/a"), "pending")
                .await;
            let body = conveyor_worker::domain::message::body(&task);
            records.push(record(&format!("{version}-{}", task.task_id), &body, 1));
        }
    }

    // Act
    let reply = run_batch(&stack.worker(), records).await;

    // Assert: every task counted once into its shard, each run completed once.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    for (job, run) in [("job-2", "run-2"), ("job-3", "run-3")] {
        assert_eq!(stack.run_counters(job, run).await, (2, 0, 0), "{job}");
        let item = stack.run_item(job, run).await;
        assert_eq!(item.status(), Some("completed"), "{item:?}");
        assert_eq!(item.n("times_completed"), Some(1));
        assert!(stack.counter_tree_faults(job, run).await.is_empty());
    }
}

#[tokio::test]
async fn a_requeue_gives_a_task_the_last_release_failed_a_full_set_of_tries() {
    // Arrange: a run whose one task the last release failed an hour ago after its five
    // tries (no `tries_since`), counted failed; its page now answers 503 twice, then the
    // page.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_job(JOB, "active").await;
    put_fixture(&stack, "v-previous/run_item_v1.json", |item| {
        item.extend(keys::run_key(&id(JOB), &id(RUN)));
        item.insert("status".into(), attributes::s("completed"));
        item.insert("tasks_remaining".into(), attributes::n(0));
        item.insert("tasks_failed".into(), attributes::n(1));
    })
    .await;
    spent_an_hour_ago(&stack, "t1", &site.url("/flaky/a"), false).await;
    let failed = [("status", "failed"), ("error", "HTTP 503")];
    let mut item = stack.task("t1").await.0;
    item.extend(failed.map(|(k, v)| (k.to_owned(), attributes::s(v))));
    stack.put_item(item).await;
    let queue = Queue::create(&stack, 30).await;

    // Act: `conveyor-ops requeue-failed`, then the task queue's receives until it ends.
    let requeue = ["requeue-failed", "--job", JOB, "--run", RUN];
    succeeded(
        &ops(
            &stack,
            &[&requeue[..], &["--queue-url", &queue.url]].concat(),
        )
        .await,
    );
    drain_until_ended(&stack, &queue, &["t1"]).await;

    // Assert: the two 503s were retried: a fresh set of three tries.
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"), "{task:?}");
    assert_eq!(task.n("attempts"), Some(3), "{task:?}");
    assert_eq!(site.hits("/flaky/a"), 3);
}

/// Now plus `offset` (which may be negative), in ms since the epoch.
fn ms_from_now(offset: i64) -> u64 {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
    let now = now.unwrap_or_default().as_millis() as i64;
    (now + offset).max(0) as u64
}

#[tokio::test]
async fn a_task_lease_the_last_release_took_is_waited_for_while_live_and_taken_over_once_expired() {
    // Arrange: two tasks the last release claimed under DUPLICATE_POLICY=lease, its lease
    // on one live for another minute, on the other a minute past.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    for (task, until) in [("live", 60_000), ("expired", -60_000)] {
        let url = attributes::s(&site.url(&format!("/page/{task}")));
        put_fixture(&stack, "v-previous/task_item_leased.json", |item| {
            item.extend(keys::task_key(&task_ref(task)));
            item.insert("url".into(), url);
            item.insert("lease_until".into(), attributes::n(ms_from_now(until)));
        })
        .await;
    }
    let worker = stack.worker_with(|t| t.duplicate_policy = DuplicatePolicy::Lease);
    let records = ["live", "expired"].map(|t| record(t, &body(t), 2)).to_vec();

    // Act
    let reply = run_batch(&worker, records).await;

    // Assert: the live lease held its task back without a fetch, and is kept; the expired
    // one was taken over, the page stored and the lease cleared.
    assert_eq!(retried(&reply), ["live"]);
    assert_eq!(site.hits("/page/live"), 0);
    let live = stack.task("live").await;
    assert_eq!(live.status(), Some("processing"));
    let kept = fixtures::item("v-previous/task_item_leased.json");
    assert_eq!(
        live.s("lease_owner"),
        attributes::string(&kept, "lease_owner")
    );
    let expired = stack.task("expired").await;
    assert_eq!(expired.status(), Some("successful"), "{expired:?}");
    assert_eq!(site.hits("/page/expired"), 1);
    assert!(expired.s("lease_owner").is_none() && expired.n("lease_until").is_none());
}

/// The run's item as the last release left it: one task ended, what tiers 1 and 2 spent,
/// the paid tier's budget and what its leases reserved.
async fn run_that_spent(stack: &Stack) {
    stack.put_job(JOB, "active").await;
    put_fixture(stack, "v-previous/run_item_v1_spent.json", |item| {
        item.extend(keys::run_key(&id(JOB), &id(RUN)));
    })
    .await;
}

fn run() -> RunRef<'static> {
    static JOB_ID: std::sync::LazyLock<Id> = std::sync::LazyLock::new(|| id(JOB));
    static RUN_ID: std::sync::LazyLock<Id> = std::sync::LazyLock::new(|| id(RUN));
    RunRef {
        job_id: &JOB_ID,
        run_id: &RUN_ID,
    }
}

#[tokio::test]
async fn a_paid_lease_the_last_release_left_to_expire_is_settled_for_the_run() {
    // Arrange: the run's item and a sandbox's paid-tier lease as the last release wrote
    // them (1 MiB reserved, 300 000 bytes noted as spent), the lease a minute past.
    let stack = Stack::new().await;
    run_that_spent(&stack).await;
    let lease = put_fixture(&stack, "v-previous/paid_lease_item.json", |item| {
        let holder = attributes::string(item, "sk").and_then(|sk| sk.strip_prefix("LEASE#"));
        let holder = holder.expect("a lease's sort key").to_owned();
        item.extend(keys::lease_key(&id(JOB), &id(RUN), &holder));
        item.insert("expires_at_ms".into(), attributes::n(ms_from_now(-60_000)));
    })
    .await;
    let store = DynamoTaskStore::new(stack.dynamodb.clone(), &stack.table);

    // Act: a sandbox of this release finds the budget held and takes expired leases back.
    let taken = store.reclaim_paid(run(), ms_from_now(0)).await;

    // Assert: the lease ended; what it noted counted as spent, the rest given back.
    assert_eq!(taken.expect("the leases read"), 1);
    let key = Item::from_iter(["pk", "sk"].map(|k| (k.to_owned(), lease[k].clone())));
    assert!(stack.item(key).await.0.is_empty(), "the lease is gone");
    let run_item = stack.run_item(JOB, RUN).await;
    assert_eq!(run_item.n("paid_tier_reserved_bytes"), Some(300_000));
    assert_eq!(run_item.n("paid_tier_spent_bytes"), Some(300_000));
}

#[tokio::test]
async fn spend_counters_the_last_release_wrote_are_read_and_added_to() {
    // Arrange: the run's item with what tiers 1 and 2 spent under the last release; a
    // delivery of this release that spent on tier 1 and met a block page there.
    let stack = Stack::new().await;
    run_that_spent(&stack).await;
    let mut spend = Spend::default();
    let tier_1 = TierSpend {
        requests: 2,
        bytes: 1_000,
        wire_bytes: 1_300,
        blocks: 1,
    };
    spend.add(1, tier_1);
    let store = DynamoTaskStore::new(stack.dynamodb.clone(), &stack.table);

    // Act: the spend recorded on the run, then the run's spend as `progress` reads it.
    let recorded = (store.record_spend(&task_ref("t1"), Counting::Run, &spend, "d1")).await;
    recorded.expect("the spend recorded");
    let run_item = stack.run_item(JOB, RUN).await;
    let read = spend_of(&[run_item.0]);

    // Assert: the last release's figures kept, this delivery's added.
    let added = TierSpend {
        requests: 5,
        bytes: 13_000,
        wire_bytes: 17_100,
        blocks: 1,
    };
    assert_eq!(read.tier(1), added);
    let kept = TierSpend {
        requests: 1,
        bytes: 4_000,
        wire_bytes: 300_000,
        blocks: 0,
    };
    assert_eq!(read.tier(2), kept);
}

#[tokio::test]
async fn tasks_as_the_last_release_and_this_one_wrote_them_note_a_new_deliverys_paid_spend() {
    // Arrange: a paid run whose free tier is blocked on both pages; `t1` as the last release
    // wrote it (no `paid_noted_by`), `t2` as this one writes it once an earlier delivery
    // noted its paid spend (`paid_noted_by` names that delivery).
    let (stack, site, datacenter, residential) = crate::proxies::budgeted_run(1 << 20, 0).await;
    let fixtures = [
        ("t1", "v-previous/task_item_processing.json"),
        ("t2", "v-current/task_item_paid_noted.json"),
    ];
    for (task, name) in fixtures {
        let url = site.url(&format!("/blocks/{}/{task}", datacenter.egress));
        put_fixture(&stack, name, |item| {
            item.extend(keys::task_key(&task_ref(task)));
            item.insert("url".into(), attributes::s(&url));
        })
        .await;
    }
    let earlier = fixtures::item(fixtures[1].1);
    let earlier = attributes::string(&earlier, "paid_noted_by").map(str::to_owned);
    let worker = crate::proxies::proxied(&stack, &[datacenter.url(), residential.url()], None);

    // Act
    let reply = run_batch(&worker, vec![delivery("t1"), delivery("t2")]).await;

    // Assert: each got its page through the paid tier, and each new delivery's note went
    // through (the task names it now).
    assert!(retried(&reply).is_empty(), "{reply:?}");
    assert_eq!(residential.requests().len(), 2);
    for task in ["t1", "t2"] {
        let item = stack.task(task).await;
        assert_eq!(item.status(), Some("successful"), "{item:?}");
        let noted = item.s("paid_noted_by").map(str::to_owned);
        assert!(noted.is_some() && noted != earlier, "{task}: {noted:?}");
    }
}

#[tokio::test]
async fn jobs_and_tasks_with_and_without_render_fields_read_as_their_producer_meant() {
    use conveyor_worker::domain::render::{Render, RenderOptions, Selector};
    use conveyor_worker::ports::tasks::TaskStore;
    let stack = Stack::new().await;
    let store = DynamoTaskStore::new(stack.dynamodb.clone(), stack.table.clone());
    let task = task_ref("task-1");
    put_fixture(&stack, "v-current/task_item_render.json", |_| {}).await;
    let mut read = Vec::new();
    for name in [
        "v-previous/job_item.json",
        "v-current/job_item_render.json",
        "v-current/job_item_render_not_valid.json",
    ] {
        put_fixture(&stack, name, |_| {}).await;
        read.push(store.load_parents(&task).await.expect("parents").render);
    }

    let asked = RenderOptions {
        render: Render::Auto,
        wait_for: Selector::parse("#prices .row"),
        timeout: Some(Duration::from_secs(20)),
        screenshot: true,
    };
    assert_eq!(
        read,
        [RenderOptions::default(), asked, RenderOptions::default()]
    );
    let loaded = store.load_task(&task).await.expect("read").expect("task");
    assert_eq!(loaded.render, Some(Render::Always));
    assert_eq!(read[1].for_task(loaded.render), Render::Always);
}

#[tokio::test]
async fn results_with_and_without_the_renderers_mark_are_described_as_their_writer_meant() {
    use conveyor_worker::domain::ids::ResultKey;
    use conveyor_worker::domain::render::Rendering;
    use conveyor_worker::ports::results::ResultStore;
    use conveyor_worker::store::s3::S3ResultStore;
    // Arrange: as the previous release stored a page; as the renderer stores one; as a later
    // release might mark one, in a form this one does not know.
    let stack = Stack::new().await;
    let store = S3ResultStore::new(stack.s3.clone(), stack.bucket.clone());
    let marks = [None, Some("requests=12 bytes=3456"), Some("v2;r=12")];
    let mut keys = Vec::new();
    for (n, mark) in marks.iter().enumerate() {
        let key = format!("results/job-1/run-1/t{n}");
        let marks: Vec<(&str, &str)> = mark.iter().map(|m| ("rendered", *m)).collect();
        let typed = (200, "text/html");
        stack
            .put_marked_object(&key, b"<html></html>", typed, &marks)
            .await;
        keys.push(ResultKey::from_stored(key));
    }

    // Act
    let mut read = Vec::new();
    for key in &keys {
        let described = store.describe(key).await.expect("read").expect("there");
        read.push(described.rendered);
    }

    // Assert
    let rendered = Rendering {
        requests: 12,
        bytes: 3456,
    };
    assert_eq!(read, [None, Some(rendered), Some(Rendering::default())]);
}
