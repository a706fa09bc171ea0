//! Block and challenge pages: never a result. Each page of the corpus
//! (`tests/fixtures/blocks/`) is judged as it expects, served by a real local site, direct
//! and through real proxy tiers (tinyproxy), with politeness at its production defaults: a
//! block climbs to the next tier at once, slows the host for the fleet, fails the task on
//! the last tier with a reason that names it, and is counted per tier in the run's counters
//! that `conveyor-ops progress` and `results` show.

use std::net::IpAddr;

use aws_sdk_dynamodb::types::AttributeValue as V;
use conveyor_testkit::block_pages::{self, Answer};
use conveyor_testkit::forward_proxy::ForwardProxy;
use conveyor_testkit::*;
use conveyor_worker::domain::blocks::{BLOCK_STATUSES, Detection};
use conveyor_worker::domain::proxy::Tiers;
use conveyor_worker::store::dynamo::{attributes, keys};

use crate::ops::{ops, succeeded};
use crate::polite_defaults::production_defaults;

/// The egress addresses of the tiers: a datacenter pool, then a residential one.
const DATACENTER: [u8; 4] = [127, 0, 0, 3];
const RESIDENTIAL: [u8; 4] = [127, 0, 0, 4];

/// What the worker makes of `answer` with the table alone: `page`, or the block's name.
fn judged(answer: &Answer) -> String {
    let detection = Detection::default();
    let by_headers = detection.by_headers(|name| answer.header(name));
    let read = (200..300).contains(&answer.status) || BLOCK_STATUSES.contains(&answer.status);
    let by_body = || read.then(|| detection.by_body(answer.header("content-type"), &answer.body));
    let block = by_headers.or_else(|| by_body().flatten());
    block.map_or_else(|| "page".to_owned(), |block| block.to_string())
}

/// A worker with politeness at its production defaults, through `tiers` if any.
fn worker(stack: &Stack, tiers: &[String]) -> TestWorker {
    let tiers = Tiers::parse(&tiers.join(";")).expect("proxy URLs");
    stack.worker_with(|t| {
        t.politeness = production_defaults();
        t.proxies = tiers;
    })
}

/// The stored object of a task, if any.
async fn stored(stack: &Stack, task: &str) -> Option<Vec<u8>> {
    let key = stack.task(task).await.s("result_key")?.to_owned();
    Some(stack.object(&key).await?.body)
}

/// A pending task per corpus answer in `cases`, named after it, each on a site of its own
/// that answers requests from `blocked` (a proxy tier's egress) with it and any other with
/// the page ([`challenged_page`](conveyor_testkit::site::challenged_page)). The sites, with
/// the path each task asks for.
pub(crate) async fn challenged_tasks(
    stack: &Stack,
    blocked: IpAddr,
    cases: &[&str],
) -> Vec<(Site, String)> {
    let mut sites = Vec::new();
    for case in cases {
        let site = Site::start().await;
        let path = format!("/challenged/{blocked}/{case}/{case}");
        stack.put_task(case, &site.url(&path), "pending").await;
        sites.push((site, path));
    }
    sites
}

/// `name:port` of a site, as the worker keys its host.
fn host(site: &Site) -> String {
    site.addr.to_string()
}

#[test]
fn every_answer_of_the_corpus_is_judged_as_it_expects() {
    let answers = block_pages::all();
    assert!(answers.iter().filter(|a| a.is_page()).count() >= 4);
    assert!(answers.iter().filter(|a| !a.is_page()).count() >= 8);

    let wrong: Vec<String> = answers
        .iter()
        .filter(|answer| judged(answer) != answer.expect)
        .map(|answer| {
            format!(
                "{}: {} (expected {})",
                answer.name,
                judged(answer),
                answer.expect
            )
        })
        .collect();

    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[tokio::test]
async fn direct_every_block_page_fails_its_task_by_name_and_every_other_page_is_stored() {
    // Arrange: each answer of the corpus on a site of its own (a host each, at the
    // production pace), one task each.
    let stack = Stack::new().await;
    stack.put_active_run().await;
    let answers = block_pages::all();
    let mut sites = Vec::new();
    for answer in &answers {
        let site = Site::start().await;
        let url = site.url(&format!("/corpus/{}", answer.name));
        stack.put_task(&answer.name, &url, "pending").await;
        sites.push(site);
    }
    let records = answers.iter().map(|a| delivery(&a.name)).collect();

    // Act
    let reply = run_batch(&worker(&stack, &[]), records).await;

    // Assert: no retries; pages stored as served, blocks failed by name with nothing stored.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    for (answer, site) in answers.iter().zip(&sites) {
        let task = stack.task(&answer.name).await;
        if answer.is_page() {
            assert_eq!(
                task.status(),
                Some("successful"),
                "{}: {task:?}",
                answer.name
            );
            assert_eq!(
                stored(&stack, &answer.name).await,
                Some(answer.body.clone())
            );
            continue;
        }
        let reason = format!("blocked: {}", answer.expect);
        assert_eq!(task.status(), Some("failed"), "{}", answer.name);
        assert_eq!(task.s("error"), Some(reason.as_str()));
        assert_eq!(stored(&stack, &answer.name).await, None, "{}", answer.name);
        let seen = stack.host_item(&host(site), "HOST").await;
        assert!(
            seen.n("slowdown").is_some(),
            "{}: the host is slowed: {seen:?}",
            answer.name
        );
    }
    let blocks = answers.iter().filter(|a| !a.is_page()).count() as u64;
    assert_eq!(
        stack.run_item(JOB, RUN).await.n("blocks_direct"),
        Some(blocks)
    );
    let progress = succeeded(&ops(&stack, &["progress", "--job", JOB, "--run", RUN]).await);
    assert!(
        progress
            .lines()
            .any(|l| l.trim_end() == format!("  blocks           {blocks}")),
        "{progress}"
    );
    let results = ops(&stack, &["results", "--job", JOB, "--run", RUN]).await;
    let summary = String::from_utf8_lossy(&results.stderr);
    assert!(
        summary.contains(&format!("failed ({blocks} on a block page)")),
        "{summary}"
    );
}

#[tokio::test]
async fn a_block_on_the_first_tier_climbs_at_once_and_the_next_tiers_page_is_stored() {
    // Arrange: the site answers the datacenter pool with a block page: a 200 challenge with
    // its header, one without it, a 403 challenge and Akamai's 403; the residential pool, the
    // paid tier of a run with a budget, gets the page.
    let stack = Stack::new().await;
    let datacenter = ForwardProxy::start(DATACENTER.into(), false).await;
    let residential = ForwardProxy::start(RESIDENTIAL.into(), false).await;
    stack.put_active_run().await;
    stack.set_paid_budget(10_000_000).await;
    let cases = [
        "cloudflare-challenge-200-header",
        "cloudflare-interstitial-200",
        "cloudflare-challenge-header",
        "akamai-access-denied",
    ];
    let sites = challenged_tasks(&stack, datacenter.egress, &cases).await;
    let tiers = [datacenter.url(), residential.url()];

    // Act
    let reply = run_batch(&worker(&stack, &tiers), cases.map(delivery).to_vec()).await;

    // Assert: one request through each tier, the page's bytes stored, one block on tier 1
    // each, the paid tier's bytes reserved of the budget, and the host slowed all the same.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    for (case, (site, path)) in cases.iter().zip(&sites) {
        assert_eq!(
            stack.task(case).await.status(),
            Some("successful"),
            "{case}"
        );
        let page = conveyor_testkit::site::challenged_page(case);
        assert_eq!(
            stored(&stack, case).await,
            Some(page.into_bytes()),
            "{case}"
        );
        let asked = site.peers_of(path);
        assert_eq!(asked, [datacenter.egress, residential.egress], "{case}");
        let seen = stack.host_item(&host(site), "HOST").await;
        assert!(seen.n("slowdown").is_some(), "{case}: {seen:?}");
    }
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!((run.n("blocks_t1"), run.n("blocks_t2")), (Some(4), None));
    assert_eq!(run.n("proxy_requests_t2"), Some(4));
    assert!(run.n("paid_tier_reserved_bytes").is_some(), "{run:?}");
}

#[tokio::test]
async fn a_block_on_every_tier_fails_the_task_naming_the_signal_and_is_counted_per_tier() {
    // Arrange: Cloudflare challenges every request, through both tiers.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let datacenter = ForwardProxy::start(DATACENTER.into(), false).await;
    let residential = ForwardProxy::start(RESIDENTIAL.into(), false).await;
    stack.put_active_run().await;
    let url = site.url("/corpus/cloudflare-challenge-header");
    stack.put_task("t1", &url, "pending").await;
    let tiers = [datacenter.url(), residential.url()];

    // Act
    let reply = run_batch(&worker(&stack, &tiers), vec![delivery("t1")]).await;

    // Assert
    assert!(retried(&reply).is_empty(), "{reply:?}");
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("failed"));
    assert_eq!(
        task.s("error"),
        Some("blocked: cloudflare challenge (cf-mitigated)")
    );
    assert_eq!(task.n("http_status"), Some(403));
    assert_eq!(stored(&stack, "t1").await, None);
    assert_eq!(site.hits("/corpus/cloudflare-challenge-header"), 2);
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!((run.n("blocks_t1"), run.n("blocks_t2")), (Some(1), Some(1)));
    let progress = succeeded(&ops(&stack, &["progress", "--job", JOB, "--run", RUN]).await);
    for line in [
        "  blocks           2",
        "  blocks_t1        1",
        "  blocks_t2        1",
    ] {
        assert!(
            progress.lines().any(|l| l.trim_end() == line),
            "{line:?} in\n{progress}"
        );
    }
}

#[tokio::test]
async fn a_block_on_the_final_attempt_fails_with_its_reason_and_is_not_sent_again() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    let url = site.url("/corpus/datadome-captcha");
    stack.put_task("last", &url, "pending").await;
    let last = record("last", &body("last"), MAX_ATTEMPTS);

    let reply = run_batch(&worker(&stack, &[]), vec![last]).await;

    assert!(retried(&reply).is_empty(), "{reply:?}");
    let task = stack.task("last").await;
    assert_eq!(task.status(), Some("failed"));
    assert_eq!(task.s("error"), Some("blocked: datadome captcha (body)"));
    assert_eq!(stored(&stack, "last").await, None);
}

/// An active job `job` with these attributes besides its status.
async fn job_with(stack: &Stack, job: &str, attributes: Vec<(&str, V)>) {
    let mut item = keys::job_key(&id(job));
    item.insert("status".into(), attributes::s("active"));
    for (name, value) in attributes {
        item.insert(name.into(), value);
    }
    stack.put_item(item).await;
}

#[tokio::test]
async fn a_jobs_own_signature_fails_its_pages_and_a_job_may_switch_detection_off() {
    // Arrange: job `walled` names its login wall; job `raw` wants every answer as it is.
    // A site each: at the production pace two tasks of one host would wait their turns.
    let (stack, walled, raw) = (Stack::new().await, Site::start().await, Site::start().await);
    let signature = [
        ("name", V::S("login wall".into())),
        ("body", V::S("id=\"login-wall\"".into())),
    ];
    let signatures = V::L(vec![V::M(signature.map(|(k, v)| (k.to_owned(), v)).into())]);
    job_with(&stack, "walled", vec![("block_signatures", signatures)]).await;
    job_with(&stack, "raw", vec![("block_detection", V::Bool(false))]).await;
    for job in ["walled", "raw"] {
        stack.put_counted_run(job, RUN, 10).await;
    }
    let wall = walled.url("/corpus/page-login-wall");
    let challenge = raw.url("/corpus/cloudflare-interstitial-200");
    stack
        .put_task_in("walled", RUN, "wall", &wall, "pending")
        .await;
    stack
        .put_task_in("raw", RUN, "challenge", &challenge, "pending")
        .await;
    let body_in = |job, task| serde_json::json!({"job_id": job, "run_id": RUN, "task_id": task});
    let records = vec![
        record("wall", &body_in("walled", "wall").to_string(), 1),
        record("challenge", &body_in("raw", "challenge").to_string(), 1),
    ];

    // Act
    let reply = run_batch(&worker(&stack, &[]), records).await;

    // Assert
    assert!(retried(&reply).is_empty(), "{reply:?}");
    let walled = stack.task_in("walled", RUN, "wall").await;
    assert_eq!(walled.s("error"), Some("blocked: login wall (job body)"));
    let raw = stack.task_in("raw", RUN, "challenge").await;
    assert_eq!(
        raw.status(),
        Some("successful"),
        "detection off: stored as served"
    );
    assert_eq!(
        judged(&block_pages::answer("page-login-wall")),
        "page",
        "the table alone"
    );
}

/// Stores `answer`'s body under `task`'s key as the last release did (with its content type,
/// before it could tell a block page).
async fn stored_by_the_last_release(stack: &Stack, task: &str, answer: &Answer) {
    let content_type = answer.header("content-type").unwrap_or_default();
    let key = Stack::key(task);
    (stack.put_typed_object(&key, &answer.body, (answer.status, content_type))).await;
}

#[tokio::test]
async fn a_block_page_an_earlier_release_stored_is_never_adopted() {
    // Arrange: two tasks whose last delivery, under the last release, stored a challenge
    // and died before its terminal write; the site now serves one page and not the other.
    // A site each: at the production pace two tasks of one host would wait their turns.
    let (stack, served, gone) = (Stack::new().await, Site::start().await, Site::start().await);
    stack.put_active_run().await;
    let challenge = block_pages::answer("cloudflare-interstitial-200");
    let now_served = served.url("/page/now-served");
    stack
        .put_task("now-served", &now_served, "processing")
        .await;
    let now_gone = gone.url("/status/404");
    stack.put_task("now-gone", &now_gone, "processing").await;
    for task in ["now-served", "now-gone"] {
        stored_by_the_last_release(&stack, task, &challenge).await;
    }
    let records = ["now-served", "now-gone"]
        .map(|t| record(t, &body(t), 2))
        .to_vec();

    // Act
    let reply = run_batch(&worker(&stack, &[]), records).await;

    // Assert: the page replaced the challenge; the failure stands, the challenge unadopted.
    assert!(retried(&reply).is_empty(), "{reply:?}");
    let served = stack.task("now-served").await;
    assert_eq!(served.status(), Some("successful"));
    let object = stack
        .object(&Stack::key("now-served"))
        .await
        .expect("stored");
    assert!(object.body != challenge.body, "the challenge was replaced");
    assert!(
        Some(object.body) == stored(&stack, "now-served").await,
        "the record's object"
    );
    let gone = stack.task("now-gone").await;
    assert_eq!(
        (gone.status(), gone.s("error")),
        (Some("failed"), Some("HTTP 404"))
    );
}
