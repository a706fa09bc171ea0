//! Refresh runs: a run submitted with `--refreshes` gives each task its earlier result, the
//! worker asks the site "changed since?" (RFC 9110), and an unchanged page's earlier object
//! is carried forward instead of paid for again; changed pages, earlier objects gone or
//! altered, and sites that ignore the question are fetched in full. Through a real proxy
//! (tinyproxy), drained by sandboxes behind the local event source mapping, politeness at
//! its production defaults (the job's own rate, as a producer sets it for a large run).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use conveyor_ops::submit::task_id;
use conveyor_testkit::block_pages;
use conveyor_testkit::forward_proxy::ForwardProxy;
use conveyor_testkit::fresh_site::FreshSite;
use conveyor_testkit::queue::Queue;
use conveyor_testkit::*;
use conveyor_worker::domain::message::{Carried, Message};
use conveyor_worker::domain::proxy::Tiers;
use conveyor_worker::store::dynamo::{attributes, keys};

use crate::ops::{list, ops, succeeded};
use crate::polite_defaults::production_defaults;
use crate::politeness::{Drained, Fleet, assert_once_each_but_doubled, drain_tuned};

/// The earlier run and the refresh.
const FIRST: &str = "first";
const REFRESH: &str = "refresh";

/// Four sandboxes of two pollers, invocations of 20 s.
const FLEET: Fleet = Fleet {
    sandboxes: 4,
    pollers: 2,
    timeout: Duration::from_secs(20),
    limit: Duration::from_secs(180),
};

/// The job, active, with its own rate and in-flight limit for its hosts at the most a job
/// may set (one local site here: the defaults' one request a second would take minutes;
/// politeness at a host's rate is `polite_defaults`' subject). The host's turn is still
/// taken for every fetch, the conditional ones too.
async fn fast_job(stack: &Stack) {
    job_with_limits(stack, (10_000, 64)).await;
}

/// The job with its own host limits, `(0, 0)` for none: a job may say its host needs no
/// turns (its own site), and the 500-page runs measure a refresh's own requests and bytes;
/// what a turn costs is the same in both runs.
async fn job_with_limits(stack: &Stack, (max_rps, max_inflight): (u32, u32)) {
    let mut item = keys::job_key(&id(JOB));
    item.insert("status".into(), attributes::s("active"));
    item.insert("host_max_rps".into(), attributes::n(max_rps));
    item.insert("host_max_inflight".into(), attributes::n(max_inflight));
    stack.put_item(item).await;
}

/// `run` of `urls` submitted by `conveyor-ops` (refreshing `refreshes`), then drained
/// through `proxy`; what `submit` printed, and the tasks whose messages the queue handed
/// two pollers at once.
async fn submit_and_drain(
    stack: &Stack,
    proxy: &ForwardProxy,
    run: (&str, Option<&str>),
    urls: &[String],
) -> (String, HashMap<String, u64>) {
    let queue = Queue::create(stack, 30).await;
    let submitted = submit(stack, &queue, run, urls).await;
    let drained = drain(stack, proxy, &queue).await;
    (submitted, drained.doubled)
}

/// `run` of `urls` submitted by `conveyor-ops` (refreshing `refreshes`) to `queue`; what it
/// printed.
async fn submit(
    stack: &Stack,
    queue: &Queue,
    (run, refreshes): (&str, Option<&str>),
    urls: &[String],
) -> String {
    let file = list(urls);
    let mut args = vec![
        "submit",
        "--job",
        JOB,
        "--run",
        run,
        "--queue-url",
        &queue.url,
    ];
    args.extend(["--urls", &file]);
    args.extend(
        refreshes
            .map(|earlier| ["--refreshes", earlier])
            .into_iter()
            .flatten(),
    );
    succeeded(&ops(stack, &args).await)
}

/// Drains `queue` with [`FLEET`], each worker through `proxy` with the production
/// politeness.
async fn drain(stack: &Stack, proxy: &ForwardProxy, queue: &Queue) -> Drained {
    let tiers = Tiers::parse(&proxy.url()).expect("the proxy's URL");
    let tune = |t: &mut WorkerTuning| {
        t.proxies = tiers.clone();
        t.politeness = production_defaults();
    };
    drain_tuned(stack, queue, &tune, FLEET).await
}

/// A run's fields as `conveyor-ops progress --json` adds them up (its shards included).
async fn run_fields(stack: &Stack, run: &str) -> serde_json::Value {
    let args = ["progress", "--job", JOB, "--run", run, "--json"];
    let printed = succeeded(&ops(stack, &args).await);
    serde_json::from_str::<serde_json::Value>(&printed).expect("JSON")["run"].clone()
}

fn field(run: &serde_json::Value, name: &str) -> u64 {
    run[name].as_str().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Each task's result key and SHA-256, by task id, as `conveyor-ops results --json` lists
/// them.
async fn results(stack: &Stack, run: &str) -> Vec<serde_json::Value> {
    let args = ["results", "--job", JOB, "--run", run, "--json"];
    let printed = succeeded(&ops(stack, &args).await);
    printed
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refresh_of_500_unchanged_pages_costs_a_fraction_of_the_first_runs_proxy_bytes() {
    // Arrange: 500 pages of 16,000 bytes through a real proxy, the first run fetched and
    // stored.
    let (stack, site) = (Stack::new().await, FreshSite::start().await);
    let proxy = ForwardProxy::start([127, 0, 0, 3].into(), false).await;
    job_with_limits(&stack, (0, 0)).await;
    let urls: Vec<String> = (0..500)
        .map(|i| site.url(&format!("/fresh/p{i}?bytes=16000")))
        .collect();
    submit_and_drain(&stack, &proxy, (FIRST, None), &urls).await;
    let first = run_fields(&stack, FIRST).await;
    let answered = site.answers();
    let hits = |i: usize| site.hits(&format!("p{i}"));
    let hits_before: Vec<usize> = (0..500).map(hits).collect();

    // Act: the same list, refreshing the first run.
    stack.calls.clear();
    let (submitted, doubled) =
        submit_and_drain(&stack, &proxy, (REFRESH, Some(FIRST)), &urls).await;
    let refresh = run_fields(&stack, REFRESH).await;
    let calls = stack.calls.calls();

    // Assert: every page asked "changed since?" and answered 304; each object carried
    // forward byte for byte; the refresh's proxy bytes a small share of the first run's.
    assert!(
        submitted.contains("(500 with a result of first)"),
        "{submitted}"
    );
    let (full, not_modified) = site.answers();
    assert_eq!(full, answered.0, "no page answered in full");
    // Once a page, but for a message the queue handed two pollers at the same moment (both
    // ask under the default DUPLICATE_POLICY=converge; moto's SQS does this at times): its
    // page, and no other, may have been asked twice. The task of line i + 1 is page i's.
    let asked: BTreeMap<String, usize> = (0..500)
        .map(|i| (task_id(i + 1).as_str().to_owned(), hits(i) - hits_before[i]))
        .collect();
    assert_once_each_but_doubled("asked", &asked, &doubled);
    assert_eq!(
        not_modified - answered.1,
        asked.values().sum::<usize>(),
        "304s"
    );
    assert_eq!(field(&refresh, "tasks_succeeded"), 500);
    assert_eq!(field(&refresh, "pages_not_modified"), 500);
    assert_eq!(field(&refresh, "bytes_not_fetched"), 500 * 16_000);
    let (first_wire, refresh_wire) = (
        field(&first, "proxy_wire_bytes_t1"),
        field(&refresh, "proxy_wire_bytes_t1"),
    );
    let share = refresh_wire as f64 / first_wire as f64;
    eprintln!(
        "first run: {first_wire} wire bytes, {} requests; refresh: {refresh_wire} wire bytes, \
         {} requests ({:.1}%); {:.2} AWS requests per refreshed task: {}",
        field(&first, "proxy_requests_t1"),
        field(&refresh, "proxy_requests_t1"),
        share * 100.0,
        calls.len() as f64 / 500.0,
        crate::politeness::by_operation(&calls),
    );
    assert!(share <= 0.05, "{share}");
    let (earlier, now) = (
        versions(&stack, FIRST).await,
        versions(&stack, REFRESH).await,
    );
    assert_eq!(earlier.len(), 500);
    assert_eq!(earlier, now, "every object byte for byte the first run's");
}

/// Each task's object in `run` by its content's MD5 (S3's ETag of an object stored whole),
/// by task id: one listing of the bucket, not a read of every object.
async fn versions(stack: &Stack, run: &str) -> std::collections::BTreeMap<String, String> {
    let mut pages = stack
        .s3
        .list_objects_v2()
        .bucket(&stack.bucket)
        .into_paginator()
        .send();
    let mut versions = std::collections::BTreeMap::new();
    let marker = format!("/{JOB}/{run}/");
    while let Some(page) = pages.next().await {
        for object in page.expect("list the bucket").contents() {
            let key = object.key().unwrap_or_default();
            if let Some((_, task)) = key.split_once(&marker) {
                let etag = object.e_tag().unwrap_or_default().to_owned();
                versions.insert(task.to_owned(), etag);
            }
        }
    }
    versions
}

/// The first and the refresh run of `urls`, the earlier results as `prepare` left them.
async fn refreshed(
    urls: &[String],
    prepare: impl AsyncFnOnce(&Stack, &[serde_json::Value]),
) -> (Stack, Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let stack = Stack::new().await;
    let proxy = ForwardProxy::start([127, 0, 0, 3].into(), false).await;
    fast_job(&stack).await;
    submit_and_drain(&stack, &proxy, (FIRST, None), urls).await;
    let earlier = results(&stack, FIRST).await;
    prepare(&stack, &earlier).await;
    submit_and_drain(&stack, &proxy, (REFRESH, Some(FIRST)), urls).await;
    let now = results(&stack, REFRESH).await;
    (stack, earlier, now)
}

fn key_of(result: &serde_json::Value) -> String {
    result["result_key"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changed_pages_and_earlier_objects_gone_or_altered_are_fetched_in_full_and_stored_new() {
    // Arrange: 12 pages; between the runs pages 0 and 1 change, the earlier objects of 2 and
    // 3 are deleted, 4 is overwritten (no checksum), 5 overwritten with a checksum of its
    // new bytes and the old SHA-256 in its metadata; 6 and 7 are on a site that ignores the
    // question, 8 and 9 on one whose 304 names another entity tag, 10 and 11 are dated only.
    let site = FreshSite::start().await;
    let mut urls: Vec<String> = (0..6).map(|i| site.url(&format!("/fresh/p{i}"))).collect();
    urls.extend((6..8).map(|i| site.url(&format!("/ignores/p{i}"))));
    urls.extend((8..10).map(|i| site.url(&format!("/liar/p{i}"))));
    urls.extend((10..12).map(|i| site.url(&format!("/dated/p{i}"))));
    let prepare = async |stack: &Stack, earlier: &[serde_json::Value]| {
        site.change("p0");
        site.change("p1");
        for gone in &earlier[2..4] {
            let deleted = stack
                .s3
                .delete_object()
                .bucket(&stack.bucket)
                .key(key_of(gone));
            deleted.send().await.expect("delete an object");
        }
        stack
            .put_object(&key_of(&earlier[4]), b"altered", 200)
            .await;
        let forged = stack
            .s3
            .put_object()
            .bucket(&stack.bucket)
            .key(key_of(&earlier[5]))
            .body(b"altered too".to_vec().into())
            .checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Sha256)
            .metadata("sha256", earlier[5]["sha256"].as_str().unwrap_or_default())
            .metadata("http-status", "200")
            .metadata("final-url", "http://earlier.example/");
        forged.send().await.expect("put an object");
    };

    // Act
    let (stack, earlier, now) = refreshed(&urls, prepare).await;

    // Assert: only the unchanged pages whose earlier object is intact were carried forward
    // (and the dated ones, by If-Modified-Since); every other page was fetched again, its
    // object the page's bytes.
    let carried: Vec<bool> = now.iter().map(|r| r["not_modified"] == true).collect();
    let expected = [
        false, false, false, false, false, false, false, false, false, false, true, true,
    ];
    assert_eq!(carried, expected, "{now:?}");
    for (i, (before, after)) in earlier.iter().zip(&now).enumerate() {
        assert_eq!(after["status"], "successful", "{after}");
        let stored = stack.object(&key_of(after)).await.expect("an object");
        let sha = stored.sha256();
        assert_eq!(
            after["sha256"],
            sha.as_str(),
            "task {i}: the record describes the bytes"
        );
        let changed = matches!(i, 0 | 1);
        assert_eq!(before["sha256"] != after["sha256"], changed, "task {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_304_that_does_not_confirm_is_fetched_in_full_at_a_turn_of_its_own() {
    // Arrange: four pages of a site whose 304 names another entity tag, stored by a first
    // run; then the job's limit for its hosts is one request at a time, one a second.
    let site = FreshSite::start().await;
    let urls: Vec<String> = (0..4).map(|i| site.url(&format!("/liar/p{i}"))).collect();
    let stack = Stack::new().await;
    let proxy = ForwardProxy::start([127, 0, 0, 3].into(), false).await;
    fast_job(&stack).await;
    submit_and_drain(&stack, &proxy, (FIRST, None), &urls).await;
    job_with_limits(&stack, (1, 1)).await;
    let first_run = site.starts().len();

    // Act
    submit_and_drain(&stack, &proxy, (REFRESH, Some(FIRST)), &urls).await;

    // Assert: each page asked "changed since?", then in full, each request at its own
    // start of the host's schedule: at most two starts within any second (a start of the
    // schedule's grid, and the one before it, late). Both requests at one start would make
    // three.
    let starts = site.starts().split_off(first_run);
    assert_eq!(
        site.answers(),
        (8, 4),
        "the first run, then a 304 and a full page each"
    );
    let second = Duration::from_secs(1);
    let most = (0..starts.len())
        .map(|i| {
            starts[i..]
                .iter()
                .take_while(|s| **s - starts[i] <= second)
                .count()
        })
        .max();
    let closest = starts.windows(2).map(|w| w[1] - w[0]).min();
    println!("refresh: at most {most:?} requests within a second, the closest {closest:?} apart");
    assert!(most <= Some(2), "{most:?} requests within a second");
    let now = results(&stack, REFRESH).await;
    assert!(
        now.iter()
            .all(|r| r["status"] == "successful" && r["not_modified"] != true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_of_refresh_tasks_converge_each_task_carried_forward_and_counted_once() {
    // Arrange: 20 unchanged pages refreshed, every message of the refresh sent twice.
    let site = FreshSite::start().await;
    let stack = Stack::new().await;
    let proxy = ForwardProxy::start([127, 0, 0, 3].into(), false).await;
    fast_job(&stack).await;
    let urls: Vec<String> = (0..20).map(|i| site.url(&format!("/fresh/p{i}"))).collect();
    submit_and_drain(&stack, &proxy, (FIRST, None), &urls).await;
    let queue = Queue::create(&stack, 30).await;
    submit(&stack, &queue, (REFRESH, Some(FIRST)), &urls).await;
    let bodies: Vec<String> = queue
        .drain(&stack)
        .await
        .into_iter()
        .filter_map(|m| m.body)
        .collect();
    let again = Queue::create(&stack, 30).await;
    for chunk in [bodies.clone(), bodies].concat().chunks(10) {
        again.send_batch(&stack, chunk).await;
    }

    // Act
    drain(&stack, &proxy, &again).await;

    // Assert: each task once successful, carried forward, counted once.
    let refresh = run_fields(&stack, REFRESH).await;
    assert_eq!(field(&refresh, "tasks_succeeded"), 20);
    assert_eq!(field(&refresh, "tasks_remaining"), 0);
    assert_eq!(field(&refresh, "pages_not_modified"), 20);
    assert_eq!(refresh["status"], "completed");
    for result in results(&stack, REFRESH).await {
        assert_eq!(result["not_modified"], true, "{result}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_earlier_object_altered_between_its_check_and_its_copy_is_never_adopted() {
    // Arrange: one unchanged page; the site holds the refresh's conditional request (the
    // worker has checked the earlier object by then, and copies it on the 304) while the
    // test overwrites that object.
    let site = FreshSite::start().await;
    let urls = vec![site.url("/fresh/p0")];
    let held = site.hold("p0");
    let prepare = async move |stack: &Stack, earlier: &[serde_json::Value]| {
        let (s3, bucket, key) = (stack.s3.clone(), stack.bucket.clone(), key_of(&earlier[0]));
        tokio::spawn(held.between(async move || {
            let altered = s3.put_object().bucket(bucket).key(key);
            let altered = altered.body(b"altered between its check and its copy".to_vec().into());
            altered.send().await.expect("put an object");
        }));
    };

    // Act
    let (stack, earlier, now) = refreshed(&urls, prepare).await;

    // Assert: the copy was refused (its source was no longer the object checked), the
    // record came back, found the earlier object altered and fetched the page in full: the
    // task's object holds the page's bytes, not the altered ones.
    assert_eq!(
        site.answers(),
        (2, 1),
        "the first fetch, the 304, the full fetch"
    );
    let result = &now[0];
    assert_eq!(result["status"], "successful", "{result}");
    assert_ne!(result["not_modified"], true, "{result}");
    let stored = stack.object(&key_of(result)).await.expect("an object");
    assert_eq!(earlier[0]["sha256"], stored.sha256().as_str());
    assert_eq!(result["sha256"], stored.sha256().as_str());
}

/// Where an earlier run's result of `task` lies.
fn earlier_key(task: &str) -> String {
    format!("{PREFIX}{JOB}/{FIRST}/{task}")
}

#[tokio::test]
async fn an_earlier_object_with_a_checksum_but_without_its_metadata_is_fetched_in_full() {
    // Arrange: a refresh task whose earlier object has S3's checksum of the bytes the task
    // names, but none of the metadata the worker writes.
    let (stack, site) = (Stack::new().await, FreshSite::start().await);
    stack.put_active_run().await;
    let page = b"<html><body>the earlier page</body></html>";
    let key = earlier_key("t1");
    stack.put_earlier(&key, page, false).await;
    let url = site.url("/fresh/p0");
    let earlier = Earlier {
        key: &key,
        body: page,
        etag: "\"e0\"",
    };
    stack
        .put_refresh_task_of(&task_ref("t1"), &url, earlier)
        .await;

    // Act
    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    // Assert: fetched in full at its first delivery, without asking "changed since?", and
    // stored as a new result.
    assert!(
        retried(&reply).is_empty(),
        "not retried toward the dead-letter queue"
    );
    assert_eq!(site.answers(), (1, 0));
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    let stored = stack.object(&Stack::key("t1")).await.expect("an object");
    assert_ne!(stored.body, page);
}

/// The page at `url` as the site serves it now: its bytes and entity tag.
async fn page_now(url: &str) -> (Vec<u8>, String) {
    let client = reqwest::Client::builder().no_proxy().build();
    let answer = client.expect("an HTTP client").get(url).send().await;
    let answer = answer.expect("the site answers");
    let etag = answer.headers()[reqwest::header::ETAG].to_str();
    let etag = etag.expect("an ASCII entity tag").to_owned();
    (answer.bytes().await.expect("the page").to_vec(), etag)
}

#[tokio::test]
async fn an_earlier_object_altered_before_its_copy_on_the_final_attempt_is_sent_again_and_fetched_in_full()
 {
    // Arrange: a refresh task on its final attempt (earlier copies spent the rest); its page
    // unchanged and its earlier object intact, but the site holds the conditional request
    // while the test overwrites that object.
    let (stack, site) = (Stack::new().await, FreshSite::start().await);
    stack.put_active_run().await;
    let url = site.url("/fresh/p0");
    let (page, etag) = page_now(&url).await;
    let key = earlier_key("t1");
    stack.put_earlier(&key, &page, true).await;
    let earlier = Earlier {
        key: &key,
        body: &page,
        etag: &etag,
    };
    stack
        .put_refresh_task_of(&task_ref("t1"), &url, earlier)
        .await;
    let queue = Queue::create(&stack, 60).await;
    let producer = Message::parse(Some(&body("t1")), None).expect("a task's body");
    let spent = producer.another_try(MAX_ATTEMPTS - 1, None, now_ms());
    queue.send(&stack, &spent).await;
    let last = queue.receive(&stack).await.expect("the final attempt");
    let altered = async || stack.put_earlier(&key, b"altered", true).await;
    let worker = stack.worker_with(|t| t.backoff.max = Duration::from_millis(200));

    // Act: the final attempt, the copy refused; then what comes back of it.
    let held = site.hold("p0").between(altered);
    let (reply, ()) = tokio::join!(run_batch(&worker, vec![last]), held);
    let (copy, _) = queue
        .wait_for_redelivery(&stack, Duration::from_secs(30))
        .await;
    let again = run_batch(&worker, vec![copy.clone()]).await;

    // Assert: acked, not dead-lettered; the copy kept the receives, fetched the page in full
    // and stored the page's bytes, not the altered ones.
    assert!(retried(&reply).is_empty(), "the copy replaces it");
    assert_eq!(
        Carried::read(copy.body.as_deref()).receives_before,
        MAX_ATTEMPTS - 1
    );
    assert!(retried(&again).is_empty());
    assert_eq!(
        site.answers(),
        (2, 1),
        "the test's look, the 304, the full fetch"
    );
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"), "{task:?}");
    let stored = stack.object(&Stack::key("t1")).await.expect("an object");
    assert_eq!(stored.body, page);
}

/// A pending refresh task `t1` of `url`, whose earlier result under [`earlier_key`] is
/// `body` (described as the worker describes it), with the page's entity tag `etag`.
async fn refresh_task(stack: &Stack, url: &str, body: &[u8], etag: &str) {
    let key = earlier_key("t1");
    stack.put_earlier(&key, body, true).await;
    let earlier = Earlier {
        key: &key,
        body,
        etag,
    };
    stack
        .put_refresh_task_of(&task_ref("t1"), url, earlier)
        .await;
}

/// A worker with politeness at its production defaults.
fn polite_worker(stack: &Stack) -> TestWorker {
    stack.worker_with(|t| t.politeness = production_defaults())
}

#[tokio::test]
async fn a_block_page_stored_at_a_refresh_tasks_key_is_replaced_by_the_carried_result() {
    // Arrange: a refresh task whose page is unchanged and whose earlier result is intact;
    // under its own key, a challenge that the last release stored (a duplicate delivery
    // of the task, before that release could tell a block page).
    let (stack, site) = (Stack::new().await, FreshSite::start().await);
    stack.put_active_run().await;
    let url = site.url("/fresh/p0");
    let (page, etag) = page_now(&url).await;
    refresh_task(&stack, &url, &page, &etag).await;
    let challenge = block_pages::answer("cloudflare-interstitial-200");
    let typed = (challenge.status, "text/html");
    (stack.put_typed_object(&Stack::key("t1"), &challenge.body, typed)).await;

    // Act
    let reply = run_batch(&polite_worker(&stack), vec![delivery("t1")]).await;

    // Assert: one 304, and the earlier result carried over the challenge; the record
    // describes it.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    assert_eq!(site.answers(), (1, 1), "the test's look, then the 304");
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"), "{task:?}");
    let stored = stack.object(&Stack::key("t1")).await.expect("an object");
    assert!(stored.body == page, "the challenge was replaced");
    assert_eq!(task.s("result_sha256"), Some(sha256_hex(&page).as_str()));
}

#[tokio::test]
async fn an_earlier_result_that_is_a_block_page_is_never_carried_forward() {
    // Arrange: a refresh task whose earlier result is a challenge (stored by an older
    // release), though the task names the entity tag of the page the site serves now.
    let (stack, site) = (Stack::new().await, FreshSite::start().await);
    stack.put_active_run().await;
    let url = site.url("/fresh/p0");
    let (page, etag) = page_now(&url).await;
    let challenge = block_pages::answer("cloudflare-interstitial-200");
    refresh_task(&stack, &url, &challenge.body, &etag).await;

    // Act
    let reply = run_batch(&polite_worker(&stack), vec![delivery("t1")]).await;

    // Assert: fetched in full without asking "changed since?", and the page stored.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    assert_eq!(
        site.answers(),
        (2, 0),
        "the test's look, then the full fetch"
    );
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"), "{task:?}");
    let stored = stack.object(&Stack::key("t1")).await.expect("an object");
    assert_eq!(stored.body, page);
}
