//! Fetching through proxies, against real forward proxies (tinyproxy, each connecting out
//! from its own loopback address as a pool's egress would): every fetch goes through them,
//! credentials come from the secret, blocks climb the tiers, the proxy's own failures are
//! never the task's, the address rules still hold, and the spend adds up to what was served.

use std::net::IpAddr;
use std::time::Duration;

use conveyor_testkit::forward_proxy::{ForwardProxy, PASSWORD, USER};
use conveyor_testkit::scenario;
use conveyor_testkit::tls_site::TlsSite;
use conveyor_testkit::*;
use conveyor_worker::domain::message::Carried;
use conveyor_worker::domain::proxy::{ProxySecret, Tiers};
use conveyor_worker::polite::Politeness;
use conveyor_worker::store::dynamo::{attributes, keys};
use conveyor_worker::wiring::config::DuplicatePolicy;

use crate::fetching::{PUBLIC, assert_refused, inward, names};
use crate::ops::{ops, succeeded};
use crate::polite_defaults::production_defaults;

/// The egress addresses of the tiers: a datacenter pool, then a residential one.
pub(crate) const DATACENTER: [u8; 4] = [127, 0, 0, 3];
pub(crate) const RESIDENTIAL: [u8; 4] = [127, 0, 0, 4];

pub(crate) fn credentials() -> String {
    serde_json::json!({ "username": USER, "password": PASSWORD }).to_string()
}

/// A worker whose fetches go through `tiers` (`;` between them), with `secret` if any.
pub(crate) fn proxied(stack: &Stack, tiers: &[String], secret: Option<&str>) -> TestWorker {
    let tiers = Tiers::parse(&tiers.join(";")).expect("proxy URLs");
    let secret = secret.map(|s| ProxySecret::parse(s).expect("a proxy secret"));
    stack.worker_with(|t| {
        t.proxies = tiers;
        t.proxy_secret = secret.unwrap_or_default();
    })
}

/// The run's spend through `tier`: requests and bytes.
pub(crate) async fn spend(stack: &Stack, tier: usize) -> (Option<u64>, Option<u64>) {
    let run = stack.run_item(JOB, RUN).await;
    let requests = run.n(&format!("proxy_requests_t{tier}"));
    (requests, run.n(&format!("proxy_bytes_t{tier}")))
}

/// A TCP server that records who connected and hangs up (an https site whose handshake
/// never completes: enough to see where a tunnel came from).
async fn tls_site_peers() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<IpAddr>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a listener");
    let addr = listener.local_addr().expect("an address");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((_, peer)) = listener.accept().await {
            let _ = tx.send(peer.ip());
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn every_fetch_goes_through_the_proxy_and_the_bytes_metered_are_the_bytes_served() {
    // Arrange
    let (stack, site) = (Stack::new().await, Site::start().await);
    let proxy = ForwardProxy::start(DATACENTER.into(), true).await;
    stack.put_active_run().await;
    let pages = [
        "/bytes/1000",
        "/bytes/15000",
        "/page/a",
        "/redirect/2",
        "/status/404",
    ];
    for (i, path) in pages.iter().enumerate() {
        stack
            .put_task(&format!("t{i}"), &site.url(path), "pending")
            .await;
    }
    let worker = proxied(&stack, &[proxy.url()], Some(&credentials()));

    // Act
    let reply = run_batch(&worker, deliveries(pages.len())).await;

    // Assert: the site saw only the proxy; the run's spend is what the site served.
    assert!(retried(&reply).is_empty());
    for i in 0..4 {
        let task = stack.task(&format!("t{i}")).await;
        assert_eq!(task.status(), Some("successful"), "t{i}: {task:?}");
    }
    let peers = site.peers();
    assert_eq!(peers.len(), pages.len() + 2, "two redirect hops: {peers:?}");
    assert!(peers.iter().all(|(_, ip)| *ip == proxy.egress), "{peers:?}");
    let served = site.bytes_served();
    assert!(served > 16_000);
    assert_eq!(
        spend(&stack, 1).await,
        (Some(peers.len() as u64), Some(served))
    );
    assert_eq!(
        proxy.requests().len(),
        peers.len(),
        "{:?}",
        proxy.requests()
    );
    let progress = succeeded(&ops(&stack, &["progress", "--job", JOB, "--run", RUN]).await);
    for line in [
        format!("  proxy_bytes_t1   {served}"),
        format!("  proxy_requests_t1 {}", peers.len()),
    ] {
        assert!(
            progress.lines().any(|l| l == line),
            "{line:?} in\n{progress}"
        );
    }
}

#[tokio::test]
async fn an_https_target_is_reached_through_a_connect_tunnel() {
    let stack = Stack::new().await;
    let proxy = ForwardProxy::start(DATACENTER.into(), true).await;
    let (tls, mut peers) = tls_site_peers().await;
    stack.put_active_run().await;
    stack
        .put_task("t1", &format!("https://{tls}/secure"), "pending")
        .await;
    let worker = proxied(&stack, &[proxy.url()], Some(&credentials()));

    let reply = run_batch(&worker, vec![delivery("t1")]).await;

    // The handshake fails (the site speaks no TLS): the site's transient failure, after a
    // tunnel the proxy opened from its own address.
    assert_eq!(retried(&reply), ["t1"]);
    assert_eq!(peers.try_recv().ok(), Some(proxy.egress));
    let requests = proxy.requests();
    assert_eq!(
        requests,
        [format!("CONNECT {tls} HTTP/1.1")],
        "{requests:?}"
    );
}

#[tokio::test]
async fn a_host_sticks_to_one_proxy_of_its_tier() {
    // Arrange: a tier of two proxies, eight pages of one host.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let first = ForwardProxy::start(DATACENTER.into(), false).await;
    let second = ForwardProxy::start([127, 0, 0, 5].into(), false).await;
    stack.put_active_run().await;
    for i in 0..8 {
        let page = site.url(&format!("/page/{i}"));
        stack.put_task(&format!("t{i}"), &page, "pending").await;
    }
    let tier = format!("{},{}", first.url(), second.url());

    // Act
    let reply = run_batch(&proxied(&stack, &[tier], None), deliveries(8)).await;

    // Assert: every request of the host came from one proxy's address.
    assert!(retried(&reply).is_empty());
    let peers: std::collections::HashSet<IpAddr> =
        site.peers().into_iter().map(|(_, ip)| ip).collect();
    assert_eq!(peers.len(), 1, "{peers:?}");
}

#[tokio::test]
async fn a_proxy_asking_for_credentials_is_a_failure_of_ours_and_never_the_tasks() {
    // Arrange: the proxy wants credentials; the worker has none. Final attempts both.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let proxy = ForwardProxy::start(DATACENTER.into(), true).await;
    let (tls, mut tls_peers) = tls_site_peers().await;
    stack.put_active_run().await;
    stack
        .put_task("plain", &site.url("/page/a"), "pending")
        .await;
    stack
        .put_task("tunnel", &format!("https://{tls}/a"), "pending")
        .await;
    let records = ["plain", "tunnel"].map(|t| record(t, &body(t), MAX_ATTEMPTS));

    // Act
    let reply = run_batch(&proxied(&stack, &[proxy.url()], None), records.into()).await;

    // Assert: retried (407 to a request and to a CONNECT alike), not failed, nothing reached.
    assert_eq!(retried(&reply), ["plain", "tunnel"]);
    for task in ["plain", "tunnel"] {
        assert_eq!(
            stack.task(task).await.status(),
            Some("processing"),
            "{task}"
        );
    }
    assert!(site.peers().is_empty());
    assert!(tls_peers.try_recv().is_err());
}

#[tokio::test]
async fn a_block_on_the_first_tier_is_tried_again_on_the_next_at_once() {
    // Arrange: the site blocks the datacenter pool's address.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let datacenter = ForwardProxy::start(DATACENTER.into(), false).await;
    let residential = ForwardProxy::start(RESIDENTIAL.into(), false).await;
    stack.put_active_run().await;
    let blocked = format!("/blocks/{}/x", datacenter.egress);
    stack.put_task("t1", &site.url(&blocked), "pending").await;
    stack
        .put_task("t2", &site.url("/retry-after/7"), "pending")
        .await;
    let worker = proxied(&stack, &[datacenter.url(), residential.url()], None);

    // Act
    let reply = run_batch(&worker, vec![delivery("t1"), delivery("t2")]).await;

    // Assert: t1 climbed to the residential tier and succeeded; a 429 that says when to
    // come back is waited for, not escalated.
    assert_eq!(retried(&reply), ["t2"]);
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    let climbed = site.peers_of(&blocked);
    assert_eq!(climbed, [datacenter.egress, residential.egress]);
    assert_eq!(residential.requests().len(), 1, "t2 never reached tier 2");
    assert_eq!(spend(&stack, 1).await.0, Some(2));
    assert_eq!(spend(&stack, 2).await.0, Some(1));
}

#[tokio::test]
async fn a_tier_whose_proxy_is_down_gives_way_to_the_next_and_the_last_ones_fault_is_ours() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    let residential = ForwardProxy::start(RESIDENTIAL.into(), false).await;
    // Nothing listens on port 1.
    let down = "http://127.0.0.1:1".to_owned();
    stack.put_active_run().await;
    stack.put_task("up", &site.url("/page/up"), "pending").await;
    stack
        .put_task("none", &site.url("/page/none"), "pending")
        .await;

    let climbed = run_batch(
        &proxied(&stack, &[down.clone(), residential.url()], None),
        vec![delivery("up")],
    )
    .await;
    let last = record("none", &body("none"), MAX_ATTEMPTS);
    let stuck = run_batch(&proxied(&stack, &[down], None), vec![last]).await;

    assert!(retried(&climbed).is_empty());
    assert_eq!(stack.task("up").await.status(), Some("successful"));
    assert_eq!(
        retried(&stuck),
        ["none"],
        "the proxy's fault, on the final attempt too"
    );
    assert_eq!(stack.task("none").await.status(), Some("processing"));
}

#[tokio::test]
async fn with_a_proxy_the_address_rules_still_hold_and_the_proxy_is_no_target() {
    // Arrange: the strict rules; the proxy itself (on private 127.0.0.1) is exempt only as
    // the proxy, named `localhost` so its name is resolved too.
    let stack = Stack::new().await;
    let public = Site::start_on(PUBLIC.into()).await;
    let inside = Site::start().await;
    let proxy = ForwardProxy::start(DATACENTER.into(), false).await;
    // A second tier on the trusted "public" address: only the proxy rule refuses it.
    let public_proxy = ForwardProxy::start_on(PUBLIC.into(), RESIDENTIAL.into(), false).await;
    stack.put_active_run().await;
    let proxy_url = format!("http://localhost:{}", proxy.addr.port());
    let mut cases = inward(&public, &inside);
    cases.push(("proxy-itself", format!("{proxy_url}/")));
    cases.push(("proxy-literal", format!("{}/", proxy.url())));
    cases.push(("proxy-public", format!("{}/", public_proxy.url())));
    for (task, url) in &cases {
        stack.put_task(task, url, "pending").await;
    }
    stack
        .put_task("public", &public.url("/page/out"), "pending")
        .await;
    let tiers = Tiers::parse(&format!("{proxy_url};{}", public_proxy.url())).expect("proxy URLs");
    let worker = stack.worker_with(|t| {
        t.allow_private_networks = false;
        t.trusted = vec![PUBLIC.into()];
        t.lookup = Some(names());
        t.proxies = tiers;
    });
    let records = cases.iter().map(|(task, _)| delivery(task)).collect();

    // Act
    let reply = run_batch(&worker, records).await;
    let out = run_batch(&worker, vec![delivery("public")]).await;

    // Assert: every case refused before it was sent; the public page came through.
    assert_refused(&stack, &reply, &cases).await;
    assert_eq!(inside.hits("/page/in"), 0, "nothing inside was reached");
    let asked = proxy.requests();
    assert!(
        asked.iter().all(|r| r.contains(&public.addr.to_string())),
        "only the public site was asked for: {asked:?}"
    );
    assert!(public_proxy.requests().is_empty());
    assert!(retried(&out).is_empty());
    assert_eq!(stack.task("public").await.status(), Some("successful"));
}

#[tokio::test]
async fn a_task_naming_a_proxy_another_way_is_refused_before_the_proxy_hears_of_it() {
    // Arrange: production politeness (robots.txt obeyed) and address rules; the proxy on
    // the trusted "public" address, configured by name; tasks spelling it other ways.
    let stack = Stack::new().await;
    let proxy = ForwardProxy::start_on(PUBLIC.into(), DATACENTER.into(), false).await;
    stack.put_active_run().await;
    let port = proxy.addr.port();
    let cases = [
        ("trailing-dot", format!("http://public.test.:{port}/")),
        ("upper-case", format!("http://PUBLIC.Test:{port}/stats")),
        ("its-address", format!("http://127.0.0.2:{port}/")),
        ("mapped", format!("http://[::ffff:127.0.0.2]:{port}/")),
    ];
    for (task, url) in &cases {
        stack.put_task(task, url, "pending").await;
    }
    let tiers = Tiers::parse(&format!("http://public.test:{port}")).expect("a proxy URL");
    let worker = stack.worker_with(|t| {
        t.allow_private_networks = false;
        t.trusted = vec![
            PUBLIC.into(),
            "::ffff:127.0.0.2".parse().expect("an address"),
        ];
        t.lookup = Some(names());
        t.proxies = tiers;
        t.politeness = production_defaults();
    });

    // Act: a batch each (two of them share a host's turn).
    let mut retried_any = Vec::new();
    for (task, _) in &cases {
        retried_any.extend(retried(&run_batch(&worker, vec![delivery(task)]).await));
    }

    // Assert: each failed as a proxy, not a page; the proxy was asked for nothing, its own
    // pages and robots.txt included.
    assert!(retried_any.is_empty(), "{retried_any:?}");
    for (task, _) in &cases {
        let item = stack.task(task).await;
        assert_eq!(item.status(), Some("failed"), "{task}");
        let error = item.s("error").unwrap_or_default();
        assert!(
            error.contains("is a proxy of PROXY_URLS"),
            "{task}: {error}"
        );
    }
    assert!(proxy.requests().is_empty(), "{:?}", proxy.requests());
}

/// A run with a paid-tier budget of `budget` bytes and `blocked` tasks (`t0`...) that the
/// datacenter tier is blocked on; the site and both tiers.
pub(crate) async fn budgeted_run(
    budget: u64,
    blocked: usize,
) -> (Stack, Site, ForwardProxy, ForwardProxy) {
    let (stack, site) = (Stack::new().await, Site::start().await);
    let datacenter = ForwardProxy::start(DATACENTER.into(), false).await;
    let residential = ForwardProxy::start(RESIDENTIAL.into(), false).await;
    stack.put_active_run().await;
    stack.set_paid_budget(budget).await;
    for i in 0..blocked {
        let path = format!("/blocks/{}/{i}", datacenter.egress);
        stack
            .put_task(&format!("t{i}"), &site.url(&path), "pending")
            .await;
    }
    (stack, site, datacenter, residential)
}

#[tokio::test]
async fn records_racing_for_the_last_of_a_paid_budget_take_one_fetch_each_sandbox_at_most() {
    // Arrange: a budget under one page; two sandboxes with ten blocked tasks each, at once.
    let (stack, _site, datacenter, residential) = budgeted_run(10, 20).await;
    let tasks: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
    let tiers = [datacenter.url(), residential.url()];
    let sandboxes = [proxied(&stack, &tiers, None), proxied(&stack, &tiers, None)];

    // Act
    let batches = sandboxes
        .iter()
        .zip(tasks.chunks(10))
        .map(|(worker, tasks)| run_batch(worker, tasks.iter().map(|t| delivery(t)).collect()));
    futures_util::future::join_all(batches).await;

    // Assert: each paid fetch held its most before it started, so no more than one a
    // sandbox began on what was left; the account holds what was spent.
    let paid = residential.requests().len();
    assert!((1..=2).contains(&paid), "{paid} paid fetches");
    let (requests, _) = spend(&stack, 2).await;
    assert_eq!(requests, Some(paid as u64));
    let run = stack.run_item(JOB, RUN).await;
    let wire = run.n("proxy_wire_bytes_t2").expect("wire bytes counted");
    assert_eq!(run.n("paid_tier_reserved_bytes"), Some(wire));
    assert_eq!(run.n("paid_tier_spent_bytes"), Some(wire));
    // The bound: the budget and one fetch's most a sandbox.
    let cap = sandboxes[0].settings.paid_fetch_cap;
    assert!(wire <= 10 + 2 * cap, "{wire}");
    eprintln!(
        "budget 10 B: {paid} paid fetches, {wire} wire bytes spent, bound {}",
        10 + 2 * cap
    );
}

#[tokio::test]
async fn four_sandboxes_racing_for_a_paid_budget_spend_it_to_its_end_and_past_it_by_less_than_a_hold_each()
 {
    // Arrange: pages of 200 KB that only the paid tier gets, MAX_BODY_BYTES 256 KiB (a
    // fetch holds 584 KiB on the wire: the page, its hops' drained bodies, framing and
    // heads), a budget of two holds; four sandboxes of three tasks each, invoked at once,
    // round after round. Leases of 5 s (production's 30 minutes, shrunk), so a refused
    // reservation is asked again after 0.5 s, a round's pause, as a message held back
    // comes again.
    let (stack, site, datacenter, residential) = budgeted_run(0, 0).await;
    let tiers = Tiers::parse(&[datacenter.url(), residential.url()].join(";")).expect("URLs");
    let sandboxes: Vec<TestWorker> = (0..4)
        .map(|_| {
            stack.worker_with(|t| {
                t.proxies = tiers.clone();
                t.max_body_bytes = 256 * 1024;
                t.paid_lease = Duration::from_secs(5);
            })
        })
        .collect();
    let cap = sandboxes[0].settings.paid_fetch_cap;
    let budget = 2 * cap;
    stack.set_paid_budget(budget).await;
    let egress = &datacenter.egress;
    let tasks: Vec<String> = (0..12).map(|i| format!("t{i}")).collect();
    for task in &tasks {
        let url = site.url(&format!("/blocks/{egress}/{task}?bytes=200000"));
        stack.put_task(task, &url, "pending").await;
    }

    // Act: every sandbox's open tasks at once, until none is open.
    for _ in 0..30 {
        let mut open = Vec::new();
        for task in &tasks {
            if !matches!(
                stack.task(task).await.status(),
                Some("successful" | "failed")
            ) {
                open.push(task.clone());
            }
        }
        if open.is_empty() {
            break;
        }
        let batches = sandboxes.iter().enumerate().map(|(k, worker)| {
            let mine = open
                .iter()
                .skip(k)
                .step_by(4)
                .map(|t| delivery(t))
                .collect();
            run_batch(worker, mine)
        });
        futures_util::future::join_all(batches).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
    }

    // Assert: the whole budget was spent, past it by less than one hold a sandbox; the
    // account holds what was spent; a task failed for the budget only once it was spent.
    let run = stack.run_item(JOB, RUN).await;
    let wire = run.n("proxy_wire_bytes_t2").expect("wire bytes counted");
    assert_eq!(run.n("paid_tier_spent_bytes"), Some(wire));
    assert_eq!(run.n("paid_tier_reserved_bytes"), Some(wire));
    assert!(
        wire >= budget && wire <= budget + 4 * cap,
        "{wire} of {budget}"
    );
    let mut outcomes = (0, 0);
    for task in &tasks {
        let item = stack.task(task).await;
        match item.status() {
            Some("successful") => outcomes.0 += 1,
            _ => {
                assert!(
                    item.s("error").unwrap_or_default().contains("budget"),
                    "{task}"
                );
                outcomes.1 += 1;
            }
        }
    }
    assert_eq!(
        outcomes.0,
        residential.requests().len(),
        "one paid fetch a success"
    );
    assert!(outcomes.1 > 0, "the budget ran out before the tasks did");
    eprintln!(
        "budget {budget} B (holds of {cap} B, 4 sandboxes): {} paid fetches, {wire} wire bytes \
         spent, {} B past the budget (bound {} B)",
        outcomes.0,
        wire - budget,
        4 * cap
    );
}

#[tokio::test]
async fn a_paid_fetch_that_takes_more_than_its_hold_on_the_wire_is_cut_there_and_fails_as_too_large()
 {
    // Arrange: a page only the paid tier gets, a gzip body without end that decodes to
    // nothing (empty blocks, 400 KB a second: the body's cap never stops it); a budget of
    // four holds.
    let (stack, site, datacenter, residential) = budgeted_run(0, 0).await;
    let worker = proxied(&stack, &[datacenter.url(), residential.url()], None);
    let cap = worker.settings.paid_fetch_cap;
    stack.set_paid_budget(4 * cap).await;
    let path = format!("/blocks/{}/endless?empty_gzip=1", datacenter.egress);
    stack.put_task("t0", &site.url(&path), "pending").await;

    // Act
    let started = std::time::Instant::now();
    let reply = run_batch(&worker, vec![delivery("t0")]).await;
    let took = started.elapsed();

    // Assert: cut at its hold long before the scrape timeout (10 s), the task failed as a
    // page too large; the spend is the hold and at most a read or two past it, all of it
    // settled in the run's account.
    assert!(retried(&reply).is_empty());
    let task = stack.task("t0").await;
    assert_eq!(task.status(), Some("failed"));
    let error = task.s("error").unwrap_or_default();
    assert!(error.contains("the paid tier's hold"), "{error}");
    assert_eq!(residential.requests().len(), 1);
    let run = stack.run_item(JOB, RUN).await;
    let wire = run.n("proxy_wire_bytes_t2").expect("wire bytes counted");
    assert!(
        (cap..=cap + 32 * 1024).contains(&wire),
        "{wire} for a hold of {cap}"
    );
    assert_eq!(run.n("paid_tier_spent_bytes"), Some(wire));
    assert_eq!(run.n("paid_tier_reserved_bytes"), Some(wire));
    eprintln!("a hold of {cap} B: cut at {wire} wire bytes after {took:?}");
}

#[tokio::test]
async fn sandboxes_that_die_in_paid_fetches_strand_their_reservations_only_until_their_leases_end()
{
    // Arrange: a budget of two fetches' most; two sandboxes whose paid fetches (a page of
    // 10 s) die with them; leases of 4 s (production's 30 minutes, shrunk, not skipped).
    let (stack, site, datacenter, residential) = budgeted_run(0, 0).await;
    let tiers = [datacenter.url(), residential.url()];
    let leased = || {
        stack.worker_with(|t| {
            t.proxies = Tiers::parse(&tiers.join(";")).expect("proxy URLs");
            t.paid_lease = Duration::from_secs(4);
        })
    };
    let survivor = leased();
    stack
        .set_paid_budget(2 * survivor.settings.paid_fetch_cap)
        .await;
    let egress = &datacenter.egress;
    // t0 and t1 take 400 ms, so that their fetches overlap: together they need the whole
    // budget at once.
    for (task, slow) in [("d0", 10_000), ("d1", 10_000), ("t0", 400), ("t1", 400)] {
        let url = site.url(&format!("/blocks/{egress}/{task}?slow_ms={slow}"));
        stack.put_task(task, &url, "pending").await;
    }

    // Act: the sandboxes die 1 s into their fetches; the survivor asks at once, then
    // once the leases are over.
    for task in ["d0", "d1"] {
        let dying = leased();
        let died = tokio::time::timeout(
            Duration::from_millis(1_000),
            run_batch(&dying, vec![delivery(task)]),
        );
        assert!(
            died.await.is_err(),
            "{task}'s sandbox was to die in its fetch"
        );
    }
    let during = run_batch(&survivor, vec![delivery("t0")]).await;
    tokio::time::sleep(Duration::from_millis(4_300)).await;
    let after = run_batch(&survivor, vec![delivery("t0"), delivery("t1")]).await;

    // Assert: held while the leases lasted, then the whole budget was there again (two
    // fetches holding a half each at once); the account holds what was spent, no more.
    assert_eq!(retried(&during).len(), 1, "the budget was held");
    assert!(retried(&after).is_empty(), "{after:?}");
    for task in ["t0", "t1"] {
        assert_eq!(stack.task(task).await.status(), Some("successful"));
    }
    let run = stack.run_item(JOB, RUN).await;
    let wire = run.n("proxy_wire_bytes_t2");
    assert!(wire.is_some_and(|wire| wire > 0));
    assert_eq!(run.n("paid_tier_spent_bytes"), wire);
    assert_eq!(run.n("paid_tier_reserved_bytes"), wire);
}

#[tokio::test]
async fn once_a_runs_paid_tier_budget_is_spent_blocked_tasks_fail_instead_of_using_it() {
    // Arrange: a budget of one byte for the residential (paid) tier.
    let (stack, site, datacenter, residential) = budgeted_run(1, 3).await;
    stack
        .put_task("free", &site.url("/page/free"), "pending")
        .await;
    let worker = proxied(&stack, &[datacenter.url(), residential.url()], None);

    // Act: one at a time.
    for task in ["t0", "t1", "t2", "free"] {
        run_batch(&worker, vec![delivery(task)]).await;
    }

    // Assert: the first blocked task took the budget; the others failed, saying why; the
    // free tier still serves.
    assert_eq!(stack.task("t0").await.status(), Some("successful"));
    for task in ["t1", "t2"] {
        let item = stack.task(task).await;
        assert_eq!(item.status(), Some("failed"));
        let error = item.s("error").unwrap_or_default();
        assert!(
            error.contains("HTTP 403") && error.contains("budget"),
            "{error}"
        );
    }
    assert_eq!(stack.task("free").await.status(), Some("successful"));
    assert_eq!(residential.requests().len(), 1);
    // After each invocation's give-back the account holds what was spent, no more.
    let run = stack.run_item(JOB, RUN).await;
    let (requests, _) = spend(&stack, 2).await;
    assert_eq!(requests, Some(1));
    let wire = run.n("proxy_wire_bytes_t2");
    assert!(wire.is_some_and(|wire| wire > 0));
    assert_eq!(run.n("paid_tier_reserved_bytes"), wire);
}

#[tokio::test]
async fn a_duplicate_fetch_is_spend_counted_and_a_redelivery_that_adopts_adds_nothing() {
    // Arrange: two copies of one task at the same moment; the page takes 300 ms, so both
    // fetch.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let proxy = ForwardProxy::start(DATACENTER.into(), false).await;
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/varying/a"), "pending")
        .await;
    // A task an earlier delivery fetched and stored, then crashed before its end.
    stack
        .put_task("t2", &site.url("/varying/b"), "processing")
        .await;
    stack
        .put_object(&Stack::key("t2"), b"stored before", 200)
        .await;
    let worker = proxied(&stack, &[proxy.url()], None);
    let copies = vec![record("m1", &body("t1"), 1), record("m2", &body("t1"), 1)];

    // Act: both copies; a redelivery of t1 after its end; the redelivery of t2.
    let both = run_batch(&worker, copies).await;
    let after = run_batch(&worker, vec![record("m3", &body("t1"), 2)]).await;
    let adopted = run_batch(&worker, vec![record("m4", &body("t2"), 2)]).await;

    // Assert: two fetches, both paid for, both counted (the second by a transaction whose
    // check needs the role's ConditionCheckItem); the redeliveries fetched nothing.
    assert_eq!(
        stack.denied().await,
        Vec::<String>::new(),
        "the role grants every call"
    );
    assert!(retried(&both).is_empty() && retried(&after).is_empty());
    assert!(retried(&adopted).is_empty());
    assert_eq!(stack.task("t2").await.status(), Some("successful"));
    assert_eq!(site.hits("/varying/a"), 2);
    assert_eq!(site.hits("/varying/b"), 0);
    assert_eq!(spend(&stack, 1).await, (Some(2), Some(site.bytes_served())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_task_costs_no_aws_request_more_and_its_spend_lands_on_its_shard() {
    // Arrange: a sharded run; 30 tasks fetched direct, 30 through the proxy, warm sandboxes
    // (and tasks left over, so no shard counts its last one here).
    let (stack, site) = (Stack::new().await, Site::start().await);
    let proxy = ForwardProxy::start(DATACENTER.into(), true).await;
    let ids: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
    stack.put_job(JOB, "active").await;
    stack.put_sharded_run((JOB, RUN), &ids, (4, 0)).await;
    for id in &ids {
        let page = format!("/bytes/{}", 2000 + id.len());
        stack.put_task(id, &site.url(&page), "pending").await;
    }
    // The run's "wanted" kept for the whole test, however slow the machine.
    let keep = Duration::from_secs(600);
    let direct = stack.worker_with(|t| t.parents_ttl = keep);
    let tiers = Tiers::parse(&proxy.url()).expect("a proxy URL");
    let secret = ProxySecret::parse(&credentials()).expect("a proxy secret");
    let through = stack.worker_with(|t| {
        (t.proxies, t.proxy_secret, t.parents_ttl) = (tiers, secret, keep);
    });
    run_batch(&direct, vec![delivery("t60")]).await;
    run_batch(&through, vec![delivery("t61")]).await;

    // Act: one task at a time, so each fetch's time is its own.
    let timed = |from: usize| {
        (from..from + 30)
            .map(|i| delivery(&format!("t{i}")))
            .collect::<Vec<_>>()
    };
    let (direct_batch, proxied_batch) = (timed(0), timed(30));
    stack.calls.clear();
    let direct_ms = fetch_times(&direct, direct_batch).await;
    let direct_calls = stack.calls.calls().len();
    stack.calls.clear();
    let proxied_ms = fetch_times(&through, proxied_batch).await;
    let proxied_calls = stack.calls.calls().len();

    // Assert: the same AWS requests; the spend on the shards (none on the run item).
    assert_eq!(proxied_calls, direct_calls, "{:?}", stack.calls.calls());
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.n("proxy_requests_t1"), None);
    let progress = succeeded(&ops(&stack, &["progress", "--job", JOB, "--run", RUN]).await);
    assert!(
        progress.lines().any(|l| l == "  proxy_requests_t1 31"),
        "{progress}"
    );
    let added = proxied_ms - direct_ms;
    println!(
        "proxy: {:.1} AWS requests a task either way; fetch median {direct_ms:.2} ms direct, {proxied_ms:.2} ms through tinyproxy (+{added:.2} ms, loopback)",
        direct_calls as f64 / 30.0
    );
    // Loose: it catches a proxy path that waits (a lookup timing out), not jitter.
    assert!(added < 250.0, "the proxy adds {added:.1} ms a fetch");
}

/// Runs `records` one batch each; the median time of a whole record, in ms.
async fn fetch_times(
    worker: &TestWorker,
    records: Vec<aws_lambda_events::event::sqs::SqsMessage>,
) -> f64 {
    let mut times = Vec::new();
    for record in records {
        let started = std::time::Instant::now();
        let reply = run_batch(worker, vec![record]).await;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        assert!(retried(&reply).is_empty());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// A run with one task, `t1`, and a worker whose one tier is the proxy stand-in at `addr`.
async fn one_task_through(addr: std::net::SocketAddr) -> (Stack, TestWorker) {
    let stack = Stack::new().await;
    stack.put_active_run().await;
    stack
        .put_task("t1", "http://127.0.0.1:9/page", "pending")
        .await;
    let worker = proxied(&stack, &[format!("http://{addr}")], None);
    (stack, worker)
}

#[tokio::test]
async fn a_request_the_proxy_drops_on_a_reused_connection_is_sent_once_more_at_once() {
    // Arrange: a proxy stand-in that answers the first request of each connection, keeps
    // it open, and hangs up on the next request sent on it; a second task through it.
    let (addr, served) = conveyor_testkit::site::hangs_up_on_reuse().await;
    let (stack, worker) = one_task_through(addr).await;
    stack
        .put_task("t2", "http://127.0.0.1:9/other", "pending")
        .await;
    run_batch(&worker, vec![delivery("t1")]).await;

    // Act: t2's request goes out on t1's kept connection.
    let reply = run_batch(&worker, vec![delivery("t2")]).await;

    // Assert: answered on a fresh connection at once; the request closed unanswered is not
    // counted (in the idle-connection race it is never read, so the site never sees it).
    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t2").await.status(), Some("successful"));
    assert_eq!(served.load(std::sync::atomic::Ordering::Relaxed), 3);
    assert_eq!(spend(&stack, 1).await, (Some(2), Some(4)));
}

#[tokio::test]
async fn a_request_the_proxy_drops_on_a_fresh_connection_is_not_sent_again_at_once() {
    // Arrange: a proxy stand-in that hangs up at once on its first request (no pool reused
    // that connection: the proxy read the request and chose not to answer), then answers.
    let (addr, served) = conveyor_testkit::site::hangs_up_once().await;
    let (_stack, worker) = one_task_through(addr).await;

    // Act
    let reply = run_batch(&worker, vec![delivery("t1")]).await;

    // Assert: one request; back for a retry.
    assert_eq!(served.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(retried(&reply), ["t1"]);
}

#[tokio::test]
async fn a_proxy_that_holds_a_request_and_hangs_up_unanswered_is_not_asked_again_at_once() {
    // Arrange: a proxy stand-in that holds every request 1.5 s, then hangs up unanswered (no
    // idle-connection race: it read the request and chose not to answer).
    let (addr, served) =
        conveyor_testkit::site::hangs_up(usize::MAX, Duration::from_millis(1_500)).await;
    let (_stack, worker) = one_task_through(addr).await;

    // Act
    let started = std::time::Instant::now();
    let reply = run_batch(&worker, vec![delivery("t1")]).await;

    // Assert: one request, not a second with the whole budget again; back for a retry.
    assert_eq!(served.load(std::sync::atomic::Ordering::Relaxed), 1);
    println!("a proxy that hangs up: back after {:?}", started.elapsed());
    assert_eq!(retried(&reply), ["t1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_run_polled_through_a_proxy_counts_every_fetch_once() {
    // Arrange: the chaos scenario's run (fine, flaky, gone, slow and dead pages, messages
    // sent up to four times), drained by `conveyor-ops poll` configured as the function is:
    // PROXY_URLS and a secret in Secrets Manager.
    let prepared = scenario::prepare(30, DuplicatePolicy::Converge).await;
    let proxy = ForwardProxy::start(DATACENTER.into(), true).await;
    let secret = crate::cold_start::secret(&credentials()).await;

    // Act
    let out = tokio::process::Command::new(ops_binary())
        .args([
            "poll",
            "--queue-url",
            &prepared.queue.url,
            "--until-drained",
        ])
        .args(["--limit", "2m", "--wait-seconds", "1"])
        .envs(scenario::ops_env(&prepared.stack))
        .env("PROXY_URLS", proxy.url())
        .env("PROXY_SECRET_ARN", secret)
        // Dead pages dead-letter in two seconds rather than eight.
        .env("RETRY_BACKOFF_MAX_MS", "400")
        // Every line the worker and its libraries (the SDK, hyper, reqwest) log, at their most
        // verbose, for the secret's sake.
        .env("RUST_LOG", "trace")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run conveyor-ops");

    // Assert: every request the site saw came through the proxy and is counted once, its
    // bytes too, whichever delivery made it and however it ended (dead pages dead-letter:
    // exit code 4).
    crate::ops::drained(&out);
    let peers = prepared.site.peers();
    assert!(peers.len() >= 30, "{}", peers.len());
    assert!(peers.iter().all(|(_, ip)| *ip == proxy.egress), "{peers:?}");
    let served = prepared.site.bytes_served();
    let (requests, bytes) = spend(&prepared.stack, 1).await;
    assert_eq!((requests, bytes), (Some(peers.len() as u64), Some(served)));
    // No line the process wrote holds the proxy's password, alone or as the header that
    // carries it.
    let said = [out.stdout, out.stderr].concat();
    let said = String::from_utf8_lossy(&said);
    let header = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    };
    for secret in [PASSWORD, header.as_str()] {
        assert!(!said.contains(secret), "the output holds {secret}");
    }
    assert!(said.lines().count() > 100, "trace lines were written");
}

#[tokio::test]
async fn a_robots_txt_the_proxy_answers_with_407_is_no_verdict_of_the_sites() {
    // Arrange: robots.txt obeyed; the proxy wants credentials, the worker has none.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let proxy = ForwardProxy::start(DATACENTER.into(), true).await;
    stack.put_active_run().await;
    stack.put_task("t0", &site.url("/page/a"), "pending").await;
    let tiers = Tiers::parse(&proxy.url()).expect("proxy URLs");
    let worker = stack.worker_with(|t| {
        t.proxies = tiers;
        t.politeness = Politeness {
            obey_robots: true,
            agent: "conveyor-worker".into(),
            ..Politeness::off()
        };
    });

    // Act
    let reply = run_batch(&worker, vec![delivery("t0")]).await;

    // Assert: robots.txt is not known (not "allow all" for a day on the proxy's word, kept
    // as the proxy's failure), and the task's try failed for a reason of ours: neither
    // fetched nor failed.
    let host = site.url("").trim_start_matches("http://").to_owned();
    let robots = stack.host_item(&host, "ROBOTS").await;
    assert_eq!(robots.s("status"), Some("unavailable"));
    assert!(robots.0.contains_key("ours"), "{robots:?}");
    assert_eq!(retried(&reply), ["t0"]);
    let task = stack.task("t0").await;
    assert_eq!(task.status(), Some("processing"), "{task:?}");
    assert_eq!(task.n("attempts"), Some(1), "a try of ours");
    assert!(site.peers().is_empty());
    assert_eq!(
        proxy.requests().len(),
        1,
        "robots.txt asked once, through the proxy"
    );
}

/// Resolves the proxy's name (`localhost`) and nothing else: `slow.test` never answers,
/// `empty.test` answers no address, every other name is not found.
struct OnlyTheProxy;

impl conveyor_worker::scraper::Lookup for OnlyTheProxy {
    fn lookup(
        &self,
        host: String,
    ) -> futures_util::future::BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            match host.as_str() {
                "localhost" => Ok(vec![IpAddr::from([127, 0, 0, 1])]),
                "slow.test" => std::future::pending().await,
                "empty.test" => Ok(Vec::new()),
                _ => Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such name",
                )),
            }
        })
    }
}

#[tokio::test]
async fn with_a_proxy_a_name_that_cannot_be_checked_here_is_not_fetched_but_retried_unless_the_proxy_is_trusted()
 {
    // Arrange: the strict rules, a proxy named `localhost`; one target name resolves nowhere
    // here, one never answers (the resolver an attacker's DNS slows down), one answers no
    // address. The first name is also fetched without a proxy.
    let stack = Stack::new().await;
    let proxy = ForwardProxy::start(DATACENTER.into(), false).await;
    stack.put_active_run().await;
    let tiers = Tiers::parse(&format!("http://localhost:{}", proxy.addr.port())).expect("a tier");
    for (task, url) in [
        ("nowhere", "http://nowhere.test/page"),
        ("slow", "http://slow.test/page"),
        ("empty", "http://empty.test/page"),
        ("direct", "http://nowhere.test/direct"),
        ("trusted", "http://nowhere.test/trusted"),
    ] {
        stack.put_task(task, url, "pending").await;
    }
    let worker = |proxies: &Tiers, trusted: bool| {
        stack.worker_with(|t| {
            t.allow_private_networks = false;
            t.lookup = Some(std::sync::Arc::new(OnlyTheProxy));
            t.proxies = proxies.clone();
            t.proxy_refuses_private = trusted;
        })
    };

    // Act
    let strict = run_batch(
        &worker(&tiers, false),
        vec![delivery("nowhere"), delivery("slow"), delivery("empty")],
    )
    .await;
    let asked_before = proxy.requests();
    let direct = run_batch(&worker(&Tiers::default(), false), vec![delivery("direct")]).await;
    run_batch(&worker(&tiers, true), vec![delivery("trusted")]).await;

    // Assert: not fetched (nothing sent to the proxy), and no verdict on the task: a DNS
    // failure here is retried, as it is without a proxy. Trusted, the proxy was asked.
    let mut strict = retried(&strict);
    strict.sort();
    assert_eq!(
        strict,
        ["empty", "nowhere", "slow"],
        "a DNS failure is transient"
    );
    assert_eq!(retried(&direct), ["direct"]);
    for task in ["nowhere", "slow", "empty", "direct"] {
        let item = stack.task(task).await;
        assert_eq!(item.status(), Some("processing"), "{task}: not failed");
    }
    assert!(asked_before.is_empty(), "{asked_before:?}");
    let asked = proxy.requests();
    assert!(
        asked.iter().any(|r| r.contains("nowhere.test/trusted")),
        "{asked:?}"
    );
}

#[tokio::test]
async fn with_a_proxy_a_robots_txt_whose_name_does_not_resolve_here_is_no_verdict_of_the_sites() {
    // Arrange: robots.txt obeyed, the strict rules, a proxy; one host's name is not found
    // here, the other's never answers (a resolver timing out).
    let stack = Stack::new().await;
    let proxy = ForwardProxy::start(DATACENTER.into(), false).await;
    stack.put_active_run().await;
    stack
        .put_task("nowhere", "http://nowhere.test/page", "pending")
        .await;
    stack
        .put_task("slow", "http://slow.test/page", "pending")
        .await;
    let tiers = Tiers::parse(&format!("http://localhost:{}", proxy.addr.port())).expect("a tier");
    let worker = stack.worker_with(|t| {
        t.allow_private_networks = false;
        t.lookup = Some(std::sync::Arc::new(OnlyTheProxy));
        t.proxies = tiers;
        t.politeness = Politeness {
            obey_robots: true,
            agent: "conveyor-worker".into(),
            ..Politeness::off()
        };
    });

    // Act
    let reply = run_batch(&worker, vec![delivery("nowhere"), delivery("slow")]).await;

    // Assert: robots.txt is unavailable for a short while (not "allow all" for a day), and
    // the tasks wait: neither fetched nor failed.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    for host in ["nowhere.test:80", "slow.test:80"] {
        let robots = stack.host_item(host, "ROBOTS").await;
        assert_eq!(robots.s("status"), Some("unavailable"), "{host}");
        let expires_at = robots.n("expires_at").unwrap_or_default();
        assert!(expires_at <= now + 60_000, "{host}: a minute at most");
    }
    let mut waiting = retried(&reply);
    waiting.sort();
    assert_eq!(waiting, ["nowhere", "slow"]);
    for task in ["nowhere", "slow"] {
        assert_eq!(stack.task(task).await.status(), Some("pending"), "{task}");
    }
    let asked = proxy.requests();
    assert!(asked.is_empty(), "{asked:?}");
}

/// The path of a redirect to `target`.
fn redirect_to(target: &str) -> String {
    let target = url::form_urlencoded::byte_serialize(target.as_bytes()).collect::<String>();
    format!("/redirect-to?url={target}")
}

/// A run, the site, its https front and a real proxy.
async fn tls_run() -> (Stack, Site, TlsSite, ForwardProxy) {
    let (stack, site) = (Stack::new().await, Site::start().await);
    let tls = TlsSite::start(site.addr).await;
    let proxy = ForwardProxy::start(DATACENTER.into(), false).await;
    stack.put_active_run().await;
    (stack, site, tls, proxy)
}

/// A worker through `proxy` that trusts the https front's CA, taking bodies of `max_body`.
fn through_to_tls(stack: &Stack, proxy: &ForwardProxy, tls: &TlsSite, max_body: u64) -> TestWorker {
    stack.worker_with(|t| {
        t.proxies = Tiers::parse(&proxy.url()).expect("proxy URLs");
        t.extra_roots = vec![tls.ca_der.clone()];
        t.max_body_bytes = max_body;
    })
}

#[tokio::test]
async fn after_a_redirect_across_schemes_who_answered_is_the_hops_question() {
    // Arrange: a site, its https front and a real proxy that hides itself (no Via: what it
    // forwards over plain http could be its own); a 502 and a 407 on the hop after a
    // redirect from https to http, and from http to https; each on its final attempt.
    let (stack, site, tls, _marking) = tls_run().await;
    let proxy = ForwardProxy::start_hidden(DATACENTER.into()).await;
    let mut tasks = Vec::new();
    for status in [502, 407] {
        let plain_hop = tls.url(&redirect_to(&site.url(&format!("/status/{status}"))));
        let tls_hop = site.url(&redirect_to(&tls.url(&format!("/status/{status}"))));
        for (task, url) in [
            (format!("to-plain-{status}"), plain_hop),
            (format!("to-tls-{status}"), tls_hop),
        ] {
            stack.put_task(&task, &url, "pending").await;
            tasks.push(record(&task, &body(&task), MAX_ATTEMPTS));
        }
    }
    // And tinyproxy's own answer on the hop after a redirect from http to https: it cannot
    // open the tunnel to a port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let nowhere = closed.local_addr().expect("an address").to_string();
    drop(closed);
    let dead = format!("https://{nowhere}/page");
    stack
        .put_task("to-dead-tls", &site.url(&redirect_to(&dead)), "pending")
        .await;
    tasks.push(record("to-dead-tls", &body("to-dead-tls"), MAX_ATTEMPTS));
    let worker = through_to_tls(&stack, &proxy, &tls, MAX_BODY_BYTES);

    // Act
    let reply = run_batch(&worker, tasks).await;

    // Assert: over plain http an unmarked answer may be the proxy's, so the hop's 502 and
    // 407 are taken as the proxy's (ours: back, the attempt unspent), whatever the first hop was;
    // inside a tunnel only the site speaks, so they end the task as the site's; a tunnel
    // the proxy refused at the second hop is the proxy's.
    let mut back = retried(&reply);
    back.sort();
    assert_eq!(back, ["to-dead-tls", "to-plain-407", "to-plain-502"]);
    let asked = proxy.requests();
    assert!(
        asked.iter().any(|r| r.starts_with("CONNECT 127.0.0.1")),
        "{asked:?}"
    );
    for status in [502, 407] {
        let item = stack.task(&format!("to-tls-{status}")).await;
        assert_eq!(item.status(), Some("failed"), "{status}");
        let error = item.s("error").unwrap_or_default();
        assert!(error.contains(&format!("HTTP {status}")), "{error}");
    }
}

#[tokio::test]
async fn wire_bytes_count_what_the_proxy_carried_a_gzip_page_through_a_tunnel_far_under_its_body() {
    // Arrange: a gzip page of 200 KB of prose over https through a real proxy, then an
    // uncompressed one of 16 KiB (MAX_BODY_BYTES raised from the tests' 16 KiB to hold the
    // page).
    let (stack, _site, tls, proxy) = tls_run().await;
    stack
        .put_task("gzip", &tls.url("/article/200000"), "pending")
        .await;
    stack
        .put_task("plain", &tls.url("/bytes/16384"), "pending")
        .await;
    let worker = through_to_tls(&stack, &proxy, &tls, 256 * 1024);

    // Act
    run_batch(&worker, vec![delivery("gzip")]).await;
    let gzip = tier_spend(&stack, 1).await;
    run_batch(&worker, vec![delivery("plain")]).await;
    let both = tier_spend(&stack, 1).await;

    // Assert: the gzip page cost a fraction of its decoded body on the wire (CONNECT and
    // the TLS handshake included); the plain one a little more than its body.
    assert_eq!(stack.task("gzip").await.status(), Some("successful"));
    let ratio = gzip.wire_bytes as f64 / gzip.bytes as f64;
    eprintln!(
        "gzip page through a tunnel: {} body bytes, {} wire bytes, ratio {ratio:.3}",
        gzip.bytes, gzip.wire_bytes
    );
    assert!(gzip.bytes >= 200_000 && ratio < 0.5, "{gzip:?}");
    let (bytes, wire) = (both.bytes - gzip.bytes, both.wire_bytes - gzip.wire_bytes);
    eprintln!("plain page through a tunnel: {bytes} body bytes, {wire} wire bytes");
    assert_eq!(bytes, 16_384);
    assert!(wire > bytes && wire < bytes + 16 * 1024, "{wire}");
}

#[tokio::test]
async fn a_sites_503_the_proxy_forwarded_fails_its_task_and_an_unmarked_one_is_ours() {
    // Arrange: pages down for good (503), each on its final attempt, one through a proxy that
    // marks what it forwards (Via, tinyproxy's default), one through a proxy that hides
    // itself (its forwarded 503 cannot be told from a gateway error of its own).
    let (stack, site) = (Stack::new().await, Site::start().await);
    let marked = ForwardProxy::start(DATACENTER.into(), false).await;
    let hidden = ForwardProxy::start_hidden(DATACENTER.into()).await;
    stack.put_active_run().await;
    stack
        .put_task("marked", &site.url("/down/a"), "pending")
        .await;
    stack
        .put_task("hidden", &site.url("/down/b"), "pending")
        .await;
    let through = |proxy: &ForwardProxy| {
        let tiers = Tiers::parse(&proxy.url()).expect("a proxy URL");
        stack.worker_with(|t| t.proxies = tiers)
    };
    let last = |task: &str| record(task, &body(task), MAX_ATTEMPTS);

    // Act
    let forwarded = run_batch(&through(&marked), vec![last("marked")]).await;
    let unmarked = run_batch(&through(&hidden), vec![last("hidden")]).await;

    // Assert: the forwarded 503 is the site's (the task fails with it); the unmarked one is
    // a failure of ours (retried, the task left open).
    assert!(retried(&forwarded).is_empty(), "{:?}", retried(&forwarded));
    let failed = stack.task("marked").await;
    assert_eq!(failed.status(), Some("failed"));
    let error = failed.s("error").unwrap_or_default();
    assert!(error.contains("HTTP 503"), "{error}");
    assert_eq!(retried(&unmarked), ["hidden"]);
    assert_eq!(stack.task("hidden").await.status(), Some("processing"));
}

#[tokio::test]
async fn a_sites_503_with_a_proxy_status_error_of_its_own_fails_its_task_through_either_kind_of_tier()
 {
    // Arrange: a site down for good, answering 503 with a `Proxy-Status` error it wrote
    // itself; final attempts. One through tinyproxy as it comes (its tier marks what it
    // forwards, with Via), one through a hidden tinyproxy on a tier that marks only its own
    // errors (`PROXY_MARKS=errors`, as an anonymous pool).
    let (stack, site) = (Stack::new().await, Site::start().await);
    let marked = ForwardProxy::start(DATACENTER.into(), false).await;
    let hidden = ForwardProxy::start_hidden(RESIDENTIAL.into()).await;
    stack.put_active_run().await;
    for task in ["marked", "hidden"] {
        let url = site.url(&format!("/down-saying-proxy/{task}"));
        stack.put_task(task, &url, "pending").await;
    }
    let through = |tiers: Tiers| stack.worker_with(|t| t.proxies = tiers);
    let forwarded = Tiers::parse(&marked.url()).expect("a proxy URL");
    let errors = Tiers::parse(&hidden.url())
        .and_then(|tiers| tiers.marked("errors"))
        .expect("a proxy URL and its marks");
    let last = |task: &str| record(task, &body(task), MAX_ATTEMPTS);

    // Act
    let via = run_batch(&through(forwarded), vec![last("marked")]).await;
    let anonymous = run_batch(&through(errors), vec![last("hidden")]).await;

    // Assert: the site's 503 each time: the task fails with it, nothing left open. Each
    // proxy asked once (no tries spent on a failure of "ours").
    assert!(retried(&via).is_empty(), "{:?}", retried(&via));
    assert!(retried(&anonymous).is_empty(), "{:?}", retried(&anonymous));
    for task in ["marked", "hidden"] {
        let item = stack.task(task).await;
        assert_eq!(item.status(), Some("failed"), "{task}: {item:?}");
        let error = item.s("error").unwrap_or_default();
        assert!(
            error.contains("HTTP 503") && !error.contains("proxy"),
            "{task}: {error}"
        );
    }
    assert_eq!((marked.requests().len(), hidden.requests().len()), (1, 1));
}

#[tokio::test]
async fn a_site_that_sends_the_relays_own_header_is_read_as_the_sites_answer() {
    // Arrange: a site answering 502 with the header the relay uses for a proxy out of
    // reach, over http and (its https front) through a tunnel; two tiers; final attempts.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let tls = TlsSite::start(site.addr).await;
    let datacenter = ForwardProxy::start(DATACENTER.into(), false).await;
    let residential = ForwardProxy::start(RESIDENTIAL.into(), false).await;
    stack.put_active_run().await;
    stack
        .put_task("plain", &site.url("/forged-relay"), "pending")
        .await;
    stack
        .put_task("tunnelled", &tls.url("/forged-relay"), "pending")
        .await;
    let tiers = Tiers::parse(&[datacenter.url(), residential.url()].join(";")).expect("URLs");
    let worker = stack.worker_with(|t| {
        t.proxies = tiers;
        t.extra_roots = vec![tls.ca_der.clone()];
    });
    let last = |task: &str| record(task, &body(task), MAX_ATTEMPTS);

    // Act
    let reply = run_batch(&worker, vec![last("plain"), last("tunnelled")]).await;

    // Assert: no climb; over http (the proxy marks what it forwards with Via) and in a
    // tunnel, the 502 is the site's: each task fails with it. Both answers' bytes are counted.
    assert!(
        residential.requests().is_empty(),
        "no climb to tier 2: {:?}",
        residential.requests()
    );
    assert!(retried(&reply).is_empty(), "{:?}", retried(&reply));
    for task in ["plain", "tunnelled"] {
        let item = stack.task(task).await;
        assert_eq!(item.status(), Some("failed"), "{task}");
        let error = item.s("error").unwrap_or_default();
        assert!(error.contains("HTTP 502"), "{task}: {error}");
    }
    let spent = tier_spend(&stack, 1).await;
    let body = "the site's own 502".len() as u64;
    assert_eq!((spent.requests, spent.bytes), (2, 2 * body), "{spent:?}");
    assert!(spent.wire_bytes > 2 * body, "{spent:?}");
}

#[tokio::test]
async fn a_terminal_write_whose_answer_was_lost_counts_the_fetchs_spend_once() {
    // Arrange: a task fetched through a proxy; the answer to its terminal write (the
    // record's first transaction) is lost after the write took, and the SDK sends it again.
    let (stack, site) = (Stack::new().await, Site::start().await);
    let proxy = ForwardProxy::start(DATACENTER.into(), false).await;
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    let lose = conveyor_testkit::lose::LoseAnswer::new("TransactWriteItems", 1);
    let lost = lose.lost.clone();
    let worker = stack.worker_with(|t| {
        t.proxies = Tiers::parse(&proxy.url()).expect("proxy URLs");
        t.dynamodb_interceptor = Some(aws_sdk_dynamodb::config::SharedInterceptor::new(lose));
    });

    // Act
    let reply = run_batch(&worker, vec![delivery("t1")]).await;

    // Assert: the task is counted once, and so is its fetch's spend.
    assert_eq!(lost.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(retried(&reply).is_empty());
    assert_eq!(stack.task("t1").await.status(), Some("successful"));
    assert_eq!(stack.run_counters(JOB, RUN).await, (1, 0, 999));
    assert_eq!(spend(&stack, 1).await, (Some(1), Some(site.bytes_served())));
}

/// A paid run of one task, `t0`, whose page at `query` the datacenter tier is blocked on
/// (the stack, site and tiers of [`budgeted_run`]), and a worker of both tiers whose fetches
/// get `scrape_timeout` and keep a second for storing the page.
async fn one_paid_task(
    query: &str,
    scrape_timeout: Duration,
) -> ((Stack, Site, ForwardProxy, ForwardProxy), TestWorker) {
    let (stack, site, datacenter, residential) = budgeted_run(1 << 20, 0).await;
    let path = format!("/blocks/{}/0?{query}", datacenter.egress);
    stack.put_task("t0", &site.url(&path), "pending").await;
    let tiers = Tiers::parse(&[datacenter.url(), residential.url()].join(";")).expect("URLs");
    let worker = stack.worker_with(|t| {
        t.proxies = tiers;
        t.scrape_timeout = scrape_timeout;
        t.store_reserve = Duration::from_secs(1);
    });
    ((stack, site, datacenter, residential), worker)
}

#[tokio::test]
async fn a_paid_fetch_gets_time_of_its_own_not_what_the_free_tier_left() {
    // Arrange: fetches of 3 s; the free tier is refused after 2.5 s, the paid tier gets the
    // page in 1 s.
    let ((stack, _site, _datacenter, residential), worker) =
        one_paid_task("block_ms=2500&slow_ms=1000", Duration::from_secs(3)).await;

    // Act
    let reply = run_batch(&worker, vec![delivery("t0")]).await;

    // Assert: the paid fetch was not cut at what the free tier left (0.5 s) and blamed on the
    // site, but had its own 3 s.
    assert!(retried(&reply).is_empty(), "{:?}", retried(&reply));
    assert_eq!(stack.task("t0").await.status(), Some("successful"));
    assert_eq!(residential.requests().len(), 1);
}

#[tokio::test]
async fn a_paid_fetch_without_a_fetchs_least_time_left_is_not_started_and_gives_its_try_back() {
    // Arrange: 3 s to the cutoff, 2 s of it for fetching; the free tier is refused after
    // 1.5 s.
    let ((stack, _site, _datacenter, residential), worker) =
        one_paid_task("block_ms=1500", Duration::from_secs(30)).await;
    let left = Duration::from_millis(3_000) + LIMITS.deadline_margin;

    // Act
    let reply = crate::production::run_batch_with(&worker, vec![delivery("t0")], left).await;

    // Assert: no paid request and nothing held of the budget; the record is retried with
    // its attempt given back, the task not failed.
    assert_eq!(retried(&reply), ["t0"]);
    assert!(
        residential.requests().is_empty(),
        "{:?}",
        residential.requests()
    );
    let task = stack.task("t0").await;
    assert_eq!(task.status(), Some("pending"), "{task:?}");
    assert_eq!(task.n("attempts"), Some(0), "{task:?}");
    let run = stack.run_item(JOB, RUN).await;
    assert_eq!(run.n("paid_tier_reserved_bytes").unwrap_or(0), 0);
}

#[tokio::test]
async fn a_paid_fetch_cut_short_by_the_invocations_end_is_ours_and_charged_only_its_bytes() {
    // Arrange: 3 s to the cutoff, 2 s of it for fetching; the free tier is refused at once,
    // the paid tier's page takes 10 s.
    let ((stack, _site, _datacenter, residential), worker) =
        one_paid_task("slow_ms=10000", Duration::from_secs(30)).await;
    let left = Duration::from_millis(3_000) + LIMITS.deadline_margin;

    // Act
    let reply = crate::production::run_batch_with(&worker, vec![delivery("t0")], left).await;

    // Assert: retried, the task not failed; the run was charged what crossed the wire, not
    // the fetch's hold.
    assert_eq!(retried(&reply), ["t0"]);
    assert_eq!(residential.requests().len(), 1);
    let task = stack.task("t0").await;
    assert_eq!(task.status(), Some("processing"), "{task:?}");
    let run = stack.run_item(JOB, RUN).await;
    let wire = run.n("proxy_wire_bytes_t2").expect("wire bytes counted");
    assert_eq!(run.n("paid_tier_spent_bytes"), Some(wire));
    assert_eq!(run.n("paid_tier_reserved_bytes"), Some(wire));
    assert!(wire < worker.settings.paid_fetch_cap, "{wire}");
}

/// Sets the run's reserved paid-tier bytes, as if sandboxes elsewhere held them (`reserved`
/// as much as the budget: the budget is held).
async fn reserve_paid_elsewhere(stack: &Stack, reserved: u64) {
    stack
        .dynamodb
        .update_item()
        .table_name(&stack.table)
        .set_key(Some(keys::run_key(&id(JOB), &id(RUN))))
        .update_expression("SET paid_tier_reserved_bytes = :reserved")
        .expression_attribute_values(":reserved", attributes::n(reserved))
        .send()
        .await
        .expect("reserve the run's budget");
}

/// `record` as SQS delivers it from `queue`.
fn on(
    queue: &conveyor_testkit::queue::Queue,
    body: &str,
) -> aws_lambda_events::event::sqs::SqsMessage {
    let mut record = record("m0", body, 1);
    record.event_source_arn = Some(queue.arn.clone());
    record
}

#[tokio::test]
async fn a_record_waiting_for_a_held_paid_budget_is_counted_and_its_copy_goes_straight_to_the_paid_tier()
 {
    // Arrange: a page the datacenter tier is blocked on, and the run's budget held elsewhere.
    let budget = 1 << 20;
    let (stack, _site, datacenter, residential) = budgeted_run(budget, 1).await;
    reserve_paid_elsewhere(&stack, budget).await;
    let queue = conveyor_testkit::queue::Queue::create(&stack, 60).await;
    let worker = proxied(&stack, &[datacenter.url(), residential.url()], None);

    // Act: the first delivery waits; the budget is given back; its copy comes to another
    // sandbox (this one keeps the refusal for a few seconds).
    let first = run_batch(&worker, vec![on(&queue, &body("t0"))]).await;
    let (copy, after) = queue
        .wait_for_redelivery(&stack, Duration::from_secs(10))
        .await;
    reserve_paid_elsewhere(&stack, 0).await;
    let other = proxied(&stack, &[datacenter.url(), residential.url()], None);
    let second = run_batch(&other, vec![copy.clone()]).await;

    // Assert: the wait was counted as a wait for the paid tier, and its copy asked the paid
    // tier alone.
    assert!(retried(&first).is_empty(), "acked: its copy waits instead");
    let carried = Carried::read(copy.body.as_deref());
    assert_eq!((carried.paid_waits, carried.waits), (1, 1), "{carried:?}");
    assert!(carried.polite_since.is_some());
    assert!(after >= Duration::from_secs(2), "{after:?}");
    assert!(retried(&second).is_empty(), "{:?}", retried(&second));
    assert_eq!(stack.task("t0").await.status(), Some("successful"));
    assert_eq!(
        datacenter.requests().len(),
        1,
        "{:?}",
        datacenter.requests()
    );
    assert_eq!(residential.requests().len(), 1);
}

#[tokio::test]
async fn a_record_that_waited_its_longest_for_a_held_paid_budget_fails_for_it() {
    // Arrange: the copy of a record whose first wait began 48 h and a minute ago (past
    // POLITE_MAX_WAIT_MS) and that waited for the paid tier; the budget still held.
    let budget = 1 << 20;
    let (stack, _site, datacenter, residential) = budgeted_run(budget, 1).await;
    reserve_paid_elsewhere(&stack, budget).await;
    let queue = conveyor_testkit::queue::Queue::create(&stack, 60).await;
    let worker = proxied(&stack, &[datacenter.url(), residential.url()], None);
    let since = std::time::SystemTime::now() - Duration::from_secs(48 * 3_600 + 60);
    let since = since
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    let worn = format!(
        r#"{{"job_id":"{JOB}","run_id":"{RUN}","task_id":"t0","polite_waits":9,"paid_waits":9,"polite_since":{}}}"#,
        since.as_millis()
    );

    // Act
    let reply = run_batch(&worker, vec![on(&queue, &worn)]).await;

    // Assert: failed for the wait, not parked again, and no tier asked.
    assert!(
        retried(&reply).is_empty(),
        "acked: failed, not dead-lettered"
    );
    let task = stack.task("t0").await;
    assert_eq!(task.status(), Some("failed"), "{task:?}");
    assert_eq!(task.s("error"), Some("waited too long for the paid budget"));
    assert_eq!(queue.depth(&stack).await, 0, "no copy");
    assert!(datacenter.requests().is_empty());
    assert!(residential.requests().is_empty());
}

#[tokio::test]
async fn a_paid_spend_note_whose_answer_was_lost_counts_the_paid_spend_once() {
    // Arrange: a task only the paid tier gets. The answer to the note of its paid spend on
    // the sandbox's lease (the record's second transaction, after the reservation) is lost
    // after the note took, and the SDK sends it again.
    let (stack, _site, datacenter, residential) = budgeted_run(1 << 20, 1).await;
    let lose = conveyor_testkit::lose::LoseAnswer::new("TransactWriteItems", 2);
    let lost = lose.lost.clone();
    let tiers = Tiers::parse(&[datacenter.url(), residential.url()].join(";")).expect("URLs");
    let worker = stack.worker_with(|t| {
        t.proxies = tiers;
        t.dynamodb_interceptor = Some(aws_sdk_dynamodb::config::SharedInterceptor::new(lose));
    });

    // Act
    let reply = run_batch(&worker, vec![delivery("t0")]).await;

    // Assert: the paid fetch's spend settled once on the run's account.
    assert_eq!(lost.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(retried(&reply).is_empty(), "{:?}", retried(&reply));
    assert_eq!(stack.task("t0").await.status(), Some("successful"));
    assert_eq!(residential.requests().len(), 1);
    let run = stack.run_item(JOB, RUN).await;
    let wire = run.n("proxy_wire_bytes_t2").expect("wire bytes counted");
    assert_eq!(run.n("paid_tier_spent_bytes"), Some(wire));
    assert_eq!(run.n("paid_tier_reserved_bytes"), Some(wire));
}

/// The run's spend through `tier`, wire bytes too.
async fn tier_spend(stack: &Stack, tier: usize) -> conveyor_worker::domain::spend::TierSpend {
    let run = stack.run_item(JOB, RUN).await;
    let n = |name: &str| run.n(&format!("{name}_t{tier}")).unwrap_or(0);
    conveyor_worker::domain::spend::TierSpend {
        requests: n("proxy_requests"),
        bytes: n("proxy_bytes"),
        wire_bytes: n("proxy_wire_bytes"),
        blocks: n("blocks"),
    }
}
