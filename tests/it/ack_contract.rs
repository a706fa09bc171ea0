//! Every row of the ack contract, end to end: the real worker against the AWS emulator (moto)
//! and a real local HTTP site.

use std::time::Duration;

use conveyor_testkit::*;

#[tokio::test]
async fn pending_task_is_claimed_scraped_stored_finished_and_acked() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    let url = site.url("/page/a");
    stack.put_task("t1", &url, "pending").await;

    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"));
    assert_eq!(task.n("attempts"), Some(1));
    assert_eq!(task.s("result_key"), Some(Stack::key("t1").as_str()));
    assert_eq!(task.n("http_status"), Some(200));
    assert_eq!(task.s("content_type"), Some("text/html; charset=utf-8"));
    assert_eq!(task.s("final_url"), Some(url.as_str()));
    assert!(task.s("finished_at").is_some_and(|t| t.ends_with('Z')));
    let object = stack
        .object(&Stack::key("t1"))
        .await
        .expect("the page is stored");
    assert_eq!(object.body, b"<html><body>page a</body></html>");
    assert_eq!(object.content_type, "text/html; charset=utf-8");
    assert_eq!(task.s("result_sha256"), Some(object.sha256().as_str()));
    assert_eq!(task.n("result_size"), Some(object.body.len() as u64));
    assert_eq!(object.metadata["sha256"], object.sha256());
    assert_eq!(object.metadata["source-url"], url);
    assert_eq!(object.metadata["final-url"], url);
    assert_eq!(object.metadata["http-status"], "200");
    assert!(object.metadata.contains_key("fetched-at"));
    assert_eq!(site.hits("/page/a"), 1);
    assert_eq!(
        stack.calls.calls(),
        [
            "GetItem",
            "BatchGetItem",
            "UpdateItem",
            "PutObject",
            "TransactWriteItems"
        ],
        "five AWS requests for a successful task"
    );
}

#[tokio::test]
async fn processing_task_is_scraped_again_and_converges_on_the_same_key() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/page/a"), "processing")
        .await;

    let reply = run_batch(&stack.worker(), vec![record("m1", &body("t1"), 2)]).await;

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("successful"));
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(task.s("result_sha256"), Some(object.sha256().as_str()));
    assert_eq!(site.hits("/page/a"), 1);
}

#[tokio::test]
async fn redelivery_after_a_crash_adopts_the_object_the_first_delivery_stored() {
    // The first delivery stored its bytes and died before the terminal write.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/page/a"), "processing")
        .await;
    stack
        .put_object(&Stack::key("t1"), b"first delivery's bytes", 203)
        .await;

    let reply = run_batch(&stack.worker(), vec![record("m1", &body("t1"), 2)]).await;

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    let object = stack.object(&Stack::key("t1")).await.expect("stored");
    assert_eq!(
        object.body, b"first delivery's bytes",
        "the first object wins"
    );
    assert_eq!(task.status(), Some("successful"));
    assert_eq!(task.s("result_sha256"), Some(object.sha256().as_str()));
    assert_eq!(task.n("result_size"), Some(object.body.len() as u64));
    assert_eq!(task.n("http_status"), Some(203));
    assert_eq!(task.s("final_url"), Some("http://earlier.example/"));
}

#[tokio::test]
async fn terminal_task_costs_one_read() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("done", &site.url("/page/done"), "successful")
        .await;
    stack
        .put_task("dead", &site.url("/page/dead"), "failed")
        .await;

    for task in ["done", "dead"] {
        stack.calls.clear();
        let reply = run_batch(&stack.worker(), vec![delivery(task)]).await;

        assert!(retried(&reply).is_empty());
        assert_eq!(
            stack.calls.calls(),
            ["GetItem"],
            "{task}: exactly one read, no S3 call"
        );
        assert_eq!(site.hits(&format!("/page/{task}")), 0, "{task}: no fetch");
    }
    assert_eq!(stack.task("done").await.status(), Some("successful"));
    assert_eq!(stack.task("dead").await.status(), Some("failed"));
}

#[tokio::test]
async fn poison_is_quarantined_then_acked_without_touching_tasks() {
    let stack = Stack::new().await;
    let bodies = [
        "not json",
        "[\"job-1\", \"run-1\", \"t1\"]",
        r#"{"run_id":"run-1","task_id":"t1"}"#,
        r#"{"job_id":"","run_id":"run-1","task_id":"t1"}"#,
        r#"{"job_id":"job-1","run_id":42,"task_id":"t1"}"#,
        r#"{"job_id":"job-1","run_id":"run-1","task_id":"t#1"}"#,
    ];
    let records = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| record(&format!("poison-{i}"), b, 1))
        .collect();

    let reply = run_batch(&stack.worker(), records).await;

    assert!(retried(&reply).is_empty());
    assert_eq!(
        stack.calls.calls(),
        vec!["PutObject"; bodies.len()],
        "no DynamoDB call"
    );
    for (i, body) in bodies.iter().enumerate() {
        let kept = stack
            .object(&format!("quarantine/poison-{i}.json"))
            .await
            .expect("quarantined");
        let kept: serde_json::Value = serde_json::from_slice(&kept.body).expect("JSON");
        assert_eq!(kept["record"]["body"], *body);
        assert_eq!(kept["record"]["messageId"], format!("poison-{i}"));
        assert_eq!(kept["record"]["attributes"]["ApproximateReceiveCount"], "1");
        assert!(!kept["reason"].as_str().unwrap_or_default().is_empty());
        assert!(kept["quarantined_at"].is_string());
    }
}

#[tokio::test]
async fn poison_that_cannot_be_quarantined_is_retried_not_lost() {
    let stack = Stack::new().await;
    let worker = stack.worker_with(|t| t.bucket = Some("no-such-bucket".into()));

    let reply = run_batch(&worker, vec![record("poison", "not json", 1)]).await;

    assert_eq!(retried(&reply), ["poison"]);
}

#[tokio::test]
async fn missing_or_unwanted_work_is_acked_without_writes() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    let url = site.url("/page/x");
    stack.put_job("cancelled-job", "cancelled").await;
    stack.put_run("cancelled-job", "r", "running").await;
    stack
        .put_task_in("cancelled-job", "r", "t", &url, "pending")
        .await;
    stack.put_job("active-job", "active").await;
    stack.put_run("active-job", "done-run", "completed").await;
    stack
        .put_task_in("active-job", "done-run", "t", &url, "pending")
        .await;
    stack
        .put_task_in("active-job", "no-run", "t", &url, "pending")
        .await;
    stack.put_task_in("no-job", "r", "t", &url, "pending").await;
    stack.put_active_run().await;
    let body_in = |job: &str, run: &str| {
        serde_json::json!({"job_id": job, "run_id": run, "task_id": "t"}).to_string()
    };
    let records = vec![
        record("task-missing", &body("never-created"), 1),
        record("job-cancelled", &body_in("cancelled-job", "r"), 1),
        record("run-completed", &body_in("active-job", "done-run"), 1),
        record("run-missing", &body_in("active-job", "no-run"), 1),
        record("job-missing", &body_in("no-job", "r"), 1),
    ];

    let reply = run_batch(&stack.worker(), records).await;

    assert!(retried(&reply).is_empty());
    let writes: Vec<_> = stack
        .calls
        .calls()
        .into_iter()
        .filter(|c| !matches!(c.as_str(), "GetItem" | "BatchGetItem"))
        .collect();
    assert!(writes.is_empty(), "no writes: {writes:?}");
    assert_eq!(site.hits("/page/x"), 0);
}

#[tokio::test]
async fn permanent_scrape_failures_fail_the_task_and_ack() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    let cases = [
        (
            "not-found",
            site.url("/status/404"),
            "HTTP 404",
            Some(404_u64),
        ),
        ("gone", site.url("/status/410"), "HTTP 410", Some(410)),
        (
            "ftp",
            "ftp://example.com/file".to_owned(),
            "scheme \"ftp\"",
            None,
        ),
        (
            "garbage",
            "not a url".to_owned(),
            "url does not parse",
            None,
        ),
        (
            "too-big",
            site.url("/big"),
            "exceeds MAX_BODY_BYTES",
            Some(200),
        ),
        (
            "loop",
            site.url("/redirect/10"),
            "more than 3 redirects",
            // The status of the redirect past the limit.
            Some(303),
        ),
    ];
    for (task, url, _, _) in &cases {
        stack.put_task(task, url, "pending").await;
    }
    let records = cases.iter().map(|(task, ..)| delivery(task)).collect();

    let reply = run_batch(&stack.worker(), records).await;

    assert!(retried(&reply).is_empty());
    for (task, _, reason, http_status) in cases {
        let item = stack.task(task).await;
        assert_eq!(item.status(), Some("failed"), "{task}");
        let error = item.s("error").unwrap_or_default();
        assert!(
            error.contains(reason),
            "{task}: {error:?} should say {reason:?}"
        );
        assert_eq!(item.n("http_status"), http_status, "{task}");
        assert!(item.s("result_key").is_none(), "{task}");
        assert!(stack.object(&Stack::key(task)).await.is_none(), "{task}");
    }
}

#[tokio::test]
async fn private_addresses_are_refused_for_good() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    let port = site.addr.port();
    let cases = [
        ("literal", format!("http://127.0.0.1:{port}/page/a")),
        ("short-form", format!("http://127.1:{port}/page/a")),
        ("name", format!("http://localhost:{port}/page/a")),
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/".to_owned(),
        ),
    ];
    for (task, url) in &cases {
        stack.put_task(task, url, "pending").await;
    }
    let records = cases.iter().map(|(task, _)| delivery(task)).collect();
    let worker = stack.worker_with(|t| t.allow_private_networks = false);

    let reply = run_batch(&worker, records).await;

    assert!(retried(&reply).is_empty());
    for (task, _) in cases {
        let item = stack.task(task).await;
        assert_eq!(item.status(), Some("failed"), "{task}");
        let error = item.s("error").unwrap_or_default();
        assert!(
            error.contains("is not on the public internet"),
            "{task}: {error}"
        );
    }
    assert_eq!(site.hits("/page/a"), 0, "nothing reached the site");
}

#[tokio::test]
async fn transient_scrape_failures_are_retried_without_a_terminal_write() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let cases = [
        ("s503", site.url("/status/503")),
        ("s500", site.url("/status/500")),
        ("s429", site.url("/status/429")),
        ("s408", site.url("/status/408")),
        ("s425", site.url("/status/425")),
        ("timeout", site.url("/slow/3000")),
        ("refused", format!("http://127.0.0.1:{closed_port}/")),
    ];
    for (task, url) in &cases {
        stack.put_task(task, url, "pending").await;
    }
    let records = cases.iter().map(|(task, _)| delivery(task)).collect();
    let worker = stack.worker_with(|t| t.scrape_timeout = std::time::Duration::from_millis(500));

    let reply = run_batch(&worker, records).await;

    let mut listed = retried(&reply);
    listed.sort();
    let mut expected: Vec<_> = cases.iter().map(|(task, _)| task.to_string()).collect();
    expected.sort();
    assert_eq!(listed, expected);
    for (task, _) in cases {
        let item = stack.task(task).await;
        assert_eq!(
            item.status(),
            Some("processing"),
            "{task}: claimed, not finished"
        );
        assert_eq!(item.n("attempts"), Some(1), "{task}");
        assert!(item.s("finished_at").is_none(), "{task}");
    }
    assert_eq!(stack.calls.count("PutObject"), 0);
}

#[tokio::test]
async fn transient_failure_on_the_final_attempt_fails_the_task_and_acks() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack
        .put_task("t1", &site.url("/status/503"), "processing")
        .await;

    let reply = run_batch(
        &stack.worker(),
        vec![record("m1", &body("t1"), MAX_ATTEMPTS)],
    )
    .await;

    assert!(retried(&reply).is_empty());
    let task = stack.task("t1").await;
    assert_eq!(task.status(), Some("failed"));
    assert_eq!(task.s("error"), Some("HTTP 503"));
    assert_eq!(task.n("http_status"), Some(503));
}

#[tokio::test]
async fn aws_errors_are_retried_without_a_terminal_write() {
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    // The result bucket does not exist: S3 refuses the put.
    let worker = stack.worker_with(|t| t.bucket = Some("no-such-bucket".into()));

    let reply = run_batch(&worker, vec![delivery("t1")]).await;

    assert_eq!(retried(&reply), ["t1"]);
    assert_eq!(stack.task("t1").await.status(), Some("processing"));
    assert_eq!(
        stack.calls.count("ChangeMessageVisibility"),
        0,
        "redelivered after the queue's own timeout, not held back"
    );
}

#[tokio::test]
async fn a_store_that_fails_is_backed_off_from_not_retried_at_once() {
    // Arrange: every S3 request answers 500 (after the SDK's own three tries).
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/page/a"), "pending").await;
    let failing = chaos::Faults {
        error_rate: 1.0,
        slow_rate: 0.0,
        delay: Duration::ZERO,
    };
    let worker = stack.worker_with(|t| t.s3_faults = Some(failing));

    // Act
    let reply = run_batch(&worker, vec![delivery("t1")]).await;

    // Assert: retried, and held back first (a growing, jittered hold), not at once.
    assert_eq!(retried(&reply), ["t1"]);
    assert_eq!(stack.task("t1").await.status(), Some("processing"));
    assert_eq!(stack.calls.count("ChangeMessageVisibility"), 1);
}

#[tokio::test]
async fn an_unreachable_aws_endpoint_is_retried() {
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let stack = Stack::at(&format!("http://127.0.0.1:{closed_port}")).await;
    stack.put_active_run().await;
    stack.put_task("t1", "http://127.0.0.1:9/", "pending").await;

    let reply = run_batch(&stack.worker(), vec![delivery("t1")]).await;

    assert_eq!(retried(&reply), ["t1"]);
    assert_eq!(stack.task("t1").await.status(), Some("pending"));
}

#[tokio::test]
async fn records_of_one_group_on_a_standard_queue_are_retried_independently() {
    // SQS fair queues: a standard queue's messages may carry a MessageGroupId, which
    // orders nothing.
    let (stack, site) = (Stack::new().await, Site::start().await);
    stack.put_active_run().await;
    stack.put_task("t1", &site.url("/down/a"), "pending").await;
    stack.put_task("t2", &site.url("/page/b"), "pending").await;
    let in_group = |task: &str| {
        let mut record = delivery(task);
        record
            .attributes
            .insert("MessageGroupId".into(), "tenant-1".into());
        record
    };

    let reply = run_batch(&stack.worker(), vec![in_group("t1"), in_group("t2")]).await;

    assert_eq!(retried(&reply), ["t1"]);
    assert_eq!(stack.task("t2").await.status(), Some("successful"));
}
