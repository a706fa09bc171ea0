//! Redirects end to end: every hop is a request of its own host. It is checked against that
//! host's robots.txt and takes that host's turn, at the production defaults (politeness, a
//! job's rate, a proxy tier), with a fleet behind the local event source mapping.

use std::collections::BTreeMap;
use std::time::Duration;

use conveyor_testkit::forward_proxy::{ForwardProxy, PASSWORD, USER};
use conveyor_testkit::polite_site::{Behaviour, PoliteSite};
use conveyor_testkit::*;
use conveyor_worker::domain::proxy::{ProxySecret, Tiers};

use crate::polite_defaults::production_defaults;
use crate::politeness::{Fleet, assert_once_each_but_doubled, drain_tuned, statuses, tasks_at};

/// Three sandboxes of two pollers each, invocations of 20 s.
const FLEET: Fleet = Fleet {
    sandboxes: 3,
    pollers: 2,
    timeout: Duration::from_secs(20),
    limit: Duration::from_secs(180),
};

/// The job's rate for each of its hosts.
const RATE: f64 = 4.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shorteners_links_take_their_targets_turns_and_robots_txt() {
    // Arrange: a link shortener, and a shop whose robots.txt keeps out /private. 24 pages
    // of the shop are asked through the shortener, 24 directly, and 4 private pages through
    // the shortener. Every fetch goes through a proxy tier.
    let stack = Stack::new().await;
    let shop = PoliteSite::start(Behaviour {
        robots: (200, "User-agent: *\nDisallow: /private\n".into()),
        page_time: Duration::from_millis(50),
        ..Behaviour::default()
    })
    .await;
    let short = PoliteSite::start(Behaviour::default()).await;
    let linked = |path: String| short.link_to(&shop, &path);
    let mut urls: Vec<String> = (0..24).map(|i| linked(format!("/page/via-{i}"))).collect();
    urls.extend((0..24).map(|i| shop.url(&format!("/page/direct-{i}"))));
    urls.extend((0..4).map(|i| linked(format!("/private/{i}"))));
    stack.put_polite_job(JOB, RATE).await;
    let (queue, dlq) = tasks_at(&stack, &urls).await;
    let proxy = ForwardProxy::start([127, 0, 0, 3].into(), true).await;
    let tiers = Tiers::parse(&proxy.url()).expect("a proxy URL");
    let secret = serde_json::json!({ "username": USER, "password": PASSWORD }).to_string();
    let secret = ProxySecret::parse(&secret).expect("a proxy secret");
    let tune = |t: &mut WorkerTuning| {
        t.politeness = production_defaults();
        t.proxies = tiers.clone();
        t.proxy_secret = secret.clone();
    };

    // Act
    let drained = drain_tuned(&stack, &queue, &tune, FLEET).await;

    // Assert: the shop's rate held over both ways in, and a link never got around it.
    let statuses = statuses(&stack, urls.len()).await;
    assert!(statuses[..48].iter().all(|s| s == "successful"));
    assert_eq!(dlq.depth(&stack).await, 0);
    let most = shop.most_started_within(Duration::from_secs(1));
    println!("redirects: the shop's most starts in a second: {most} (its rate {RATE}/s)");
    assert!(most <= RATE as usize + 1, "{most} starts in a second");
    assert!(shop.most_in_flight() <= 2, "the default in-flight limit");
    // robots.txt kept the private pages out, and their tasks say where the links led.
    assert_eq!(shop.hits("/private"), 0);
    for i in 0..4 {
        let task = stack.task(&format!("t{:03}", 48 + i)).await;
        let disallowed = format!(
            "disallowed by robots.txt: {}",
            shop.url(&format!("/private/{i}"))
        );
        assert_eq!(task.status(), Some("failed"));
        assert_eq!(task.s("error"), Some(disallowed.as_str()));
    }
    assert_eq!(shop.hits("/robots.txt"), 1, "once for the fleet");
    // Each link was asked once and each page fetched once, although hops waited for the
    // shop's turn as parked copies: a copy goes on from its hop.
    let via = |i: usize| (format!("/to/{}", shop_addr(&shop, i)), format!("t{i:03}"));
    let links = counts(&short, 0..24, via);
    assert_once_each_but_doubled("asked", &links, &drained.doubled);
    let pages = counts(&shop, 0..24, |i| {
        (format!("/page/via-{i}"), format!("t{i:03}"))
    });
    assert_once_each_but_doubled("fetched", &pages, &drained.doubled);
    let copies = stack.calls.count("SendMessage");
    println!("redirects: {copies} parked copies for {} tasks", urls.len());
    // The result names the page the link led to, on the task and on the object.
    let first = stack.task("t000").await;
    let landed = shop.url("/page/via-0");
    assert_eq!(first.s("final_url"), Some(landed.as_str()));
    let key = first.s("result_key").expect("a result key");
    let object = stack.object(key).await.expect("the stored page");
    assert_eq!(object.metadata.get("final-url"), Some(&landed));
}

/// The shop's address and the path of link `i`, as the shortener's path spells them.
fn shop_addr(shop: &PoliteSite, i: usize) -> String {
    let page = shop.url(&format!("/page/via-{i}"));
    page.trim_start_matches("http://").to_owned()
}

/// How many times each task's path was requested on `site`, by task id.
fn counts(
    site: &PoliteSite,
    tasks: std::ops::Range<usize>,
    path_of: impl Fn(usize) -> (String, String),
) -> BTreeMap<String, usize> {
    let visits = site.visits();
    tasks
        .map(|i| {
            let (path, task) = path_of(i);
            let times = visits.iter().filter(|v| v.path == path).count();
            (task, times)
        })
        .collect()
}

#[tokio::test]
async fn a_copy_carrying_its_hops_counts_them_toward_the_redirect_limit() {
    // Arrange: a copy that already followed 3 redirects (the tests' MAX_REDIRECTS), whose
    // next hop redirects once more.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t", &site.url("/page/start"), "pending")
        .await;
    let before: Vec<String> = (0..3)
        .map(|i| site.url(&format!("/page/hop-{i}")))
        .collect();
    let mut body: serde_json::Value = serde_json::from_str(&body("t")).expect("a body");
    body["hops"] = serde_json::json!({
        "next": site.url("/redirect/1"),
        "before": before,
        "in_full": false,
    });
    let copy = record("t", &body.to_string(), 1);

    // Act
    let reply = run_batch(&stack.worker(), vec![copy]).await;

    // Assert: the hop was fetched (not the task's own URL), and the chain is past the limit.
    assert!(retried(&reply).is_empty());
    let task = stack.task("t").await;
    assert_eq!(task.status(), Some("failed"));
    assert_eq!(task.s("error"), Some("more than 3 redirects"));
    assert_eq!(site.hits("/redirect/1"), 1);
    assert_eq!(site.hits("/page/start"), 0);
}
