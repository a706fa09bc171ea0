//! Upgrades: items an earlier release wrote, kept under `tests/fixtures/` as it wrote them,
//! are put in the table and read by this worker as that release meant them. A fixture of
//! another item kind needs a file and a test here; `put_fixture` moves it to the test's
//! own keys and times.

use std::time::{Duration, SystemTime};

use conveyor_testkit::fixtures;
use conveyor_testkit::polite_site::{Behaviour, PoliteSite};
use conveyor_testkit::*;
use conveyor_worker::domain::ids::TaskRef;
use conveyor_worker::polite::Politeness;
use conveyor_worker::polite::limits::HostLimits;
use conveyor_worker::store::dynamo::attributes::{self, Item};
use conveyor_worker::store::dynamo::keys;

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
    // its page down; the producer's message, as SQS delivers it (with its SentTimestamp).
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
    })
    .await;
    let queue = conveyor_testkit::queue::Queue::create(&stack, 60).await;
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
