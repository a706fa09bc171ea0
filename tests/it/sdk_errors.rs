//! The stores' reading of AWS error shapes that the emulator cannot produce on demand
//! (throttling, 5xx, conditional check failures), through aws-smithy-mocks.

use aws_config::retry::RetryConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemOutput;
use aws_sdk_dynamodb::operation::transact_write_items::{
    TransactWriteItemsError, TransactWriteItemsOutput,
};
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::error::{
    ConditionalCheckFailedException, TransactionCanceledException,
};
use aws_sdk_dynamodb::types::{AttributeValue, CancellationReason, KeysAndAttributes};
use aws_smithy_mocks::{MockResponseInterceptor, Rule, RuleMode, create_mock_http_client, mock};
use aws_smithy_runtime_api::http::{Response, StatusCode};
use aws_smithy_types::body::SdkBody;
use conveyor_worker::domain::ids::{Id, ResultKey, RunRef, TaskRef};
use conveyor_worker::domain::model::{Counting, Failure, Page, Terminal};
use conveyor_worker::domain::spend::{CountedIn, DeliverySpend, PaidLease, Reservation, Spend};
use conveyor_worker::ports::error::{StoreError, StoreFault};
use conveyor_worker::ports::results::{NewResult, ResultStore};
use conveyor_worker::ports::secrets::Secrets;
use conveyor_worker::ports::spend::SpendStore;
use conveyor_worker::ports::tasks::{Claim, Finish, TaskStore, TriesFrom};
use conveyor_worker::pushback::retry::{Patience, RetryPolicy};
use conveyor_worker::store::dynamo::DynamoTaskStore;
use conveyor_worker::store::s3::S3ResultStore;
use conveyor_worker::store::secrets::SecretsManager;
use conveyor_worker::worker::converge::{Converged, Stores};
use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

/// Clients answered by one mock rule, built without the SDKs' `test-util` feature (so tests
/// share the SDK build with the binary) and without retries.
fn mocked(rule: &Rule) -> (SdkConfig, MockResponseInterceptor) {
    let sdk = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(
            aws_credential_types::provider::SharedCredentialsProvider::new(Credentials::new(
                "test", "test", None, None, "mocks",
            )),
        )
        .http_client(create_mock_http_client())
        .retry_config(RetryConfig::disabled())
        .build();
    let interceptor = MockResponseInterceptor::new()
        .rule_mode(RuleMode::Sequential)
        .with_rule(rule);
    (sdk, interceptor)
}

fn tasks(rule: &Rule) -> DynamoTaskStore {
    let (sdk, interceptor) = mocked(rule);
    let config = aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(interceptor);
    DynamoTaskStore::new(aws_sdk_dynamodb::Client::from_conf(config.build()), "tasks")
}

fn results(rule: &Rule) -> S3ResultStore {
    let (sdk, interceptor) = mocked(rule);
    let config = aws_sdk_s3::config::Builder::from(&sdk).interceptor(interceptor);
    S3ResultStore::new(aws_sdk_s3::Client::from_conf(config.build()), "results")
}

fn task() -> TaskRef {
    let id = |s: &str| Id::parse(s).expect("a valid id");
    TaskRef::new(id("j"), id("r"), id("t"))
}

fn http(status: u16, body: &'static str) -> Response {
    let status = StatusCode::try_from(status).expect("a valid status");
    Response::new(status, SdkBody::from(body))
}

/// A task store whose every UpdateItem fails its condition, returning the old item with
/// `old_status` (as `ReturnValuesOnConditionCheckFailure` does), or none for a missing item.
fn store_failing_conditions(old_status: Option<&'static str>) -> DynamoTaskStore {
    let rule = mock!(aws_sdk_dynamodb::Client::update_item).then_error(move || {
        let mut failure = ConditionalCheckFailedException::builder();
        if let Some(status) = old_status {
            failure = failure.item("status", AttributeValue::S(status.into()));
        }
        UpdateItemError::ConditionalCheckFailedException(failure.build())
    });
    tasks(&rule)
}

fn fault(result: Result<impl std::fmt::Debug, StoreError>) -> StoreFault {
    let err = result.expect_err("the call fails");
    err.fault()
        .cloned()
        .unwrap_or_else(|| panic!("not an AWS fault: {err:?}"))
}

#[tokio::test]
async fn throttled_reads_are_classified_as_throttled() {
    for body in [
        r#"{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"slow down"}"#,
        r#"{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"slow down"}"#,
        r#"{"__type":"com.amazonaws.dynamodb.v20120810#RequestLimitExceeded","message":"slow down"}"#,
    ] {
        let rule =
            mock!(aws_sdk_dynamodb::Client::get_item).then_http_response(move || http(400, body));
        let store = tasks(&rule);

        assert_eq!(
            fault(store.load_task(&task()).await),
            StoreFault::Throttled,
            "{body}"
        );
    }
}

#[tokio::test]
async fn server_errors_are_classified_as_service_failures() {
    let rule = mock!(aws_sdk_dynamodb::Client::get_item)
        .then_http_response(|| http(500, r#"{"__type":"InternalServerError","message":"boom"}"#));
    let store = tasks(&rule);

    assert_eq!(
        fault(store.load_task(&task()).await),
        StoreFault::ServiceFailed
    );
}

#[tokio::test]
async fn a_claim_refused_for_a_terminal_task_is_an_outcome_not_an_error() {
    let store = store_failing_conditions(Some("successful"));

    let claim = store
        .claim(&task(), SystemTime::now(), None, TriesFrom::default())
        .await
        .expect("an outcome");

    assert_eq!(claim, Claim::AlreadyTerminal);
}

#[tokio::test]
async fn a_claim_refused_for_a_missing_task_says_it_is_missing() {
    let store = store_failing_conditions(None);

    let claim = store
        .claim(&task(), SystemTime::now(), None, TriesFrom::default())
        .await
        .expect("an outcome");

    assert_eq!(claim, Claim::Missing);
}

fn cancelled(codes: &'static [&'static str]) -> Rule {
    mock!(aws_sdk_dynamodb::Client::transact_write_items).then_error(move || {
        let reasons = codes
            .iter()
            .map(|code| CancellationReason::builder().code(*code).build())
            .collect();
        TransactWriteItemsError::TransactionCanceledException(
            TransactionCanceledException::builder()
                .set_cancellation_reasons(Some(reasons))
                .build(),
        )
    })
}

/// A delivery that spent nothing through proxies.
fn no_spend() -> DeliverySpend<'static> {
    static NONE: std::sync::LazyLock<Spend> = std::sync::LazyLock::new(Spend::default);
    DeliverySpend {
        spend: &NONE,
        delivery: "delivery",
    }
}

fn failed() -> Terminal {
    Terminal::Failed(Failure {
        reason: "HTTP 404".into(),
        http_status: Some(404),
    })
}

#[tokio::test]
async fn a_terminal_write_refused_by_the_task_condition_lost_the_race() {
    let store = tasks(&cancelled(&["ConditionalCheckFailed", "None"]));

    let finish = store
        .finish(&task(), &failed(), run_counted(), SystemTime::now())
        .await
        .expect("an outcome");

    assert_eq!(finish, Finish::LostRace);
}

#[tokio::test]
async fn a_transaction_conflict_is_a_concurrent_change_to_retry() {
    let store = tasks(&cancelled(&["None", "TransactionConflict"]));

    let err = store
        .finish(&task(), &failed(), run_counted(), SystemTime::now())
        .await
        .expect_err("a conflict");

    assert!(err.is_conflict(), "{err:?}");
}

#[tokio::test]
async fn a_paid_tier_reservation_meeting_a_transaction_conflict_is_asked_again_in_place() {
    // Arrange: production cancels overlapping transactions of the run item; the third try
    // goes through.
    let conflict = || {
        let reasons = ["TransactionConflict", "None"]
            .map(|code| CancellationReason::builder().code(code).build());
        TransactWriteItemsError::TransactionCanceledException(
            TransactionCanceledException::builder()
                .set_cancellation_reasons(Some(reasons.into()))
                .build(),
        )
    };
    let rule = mock!(aws_sdk_dynamodb::Client::transact_write_items)
        .sequence()
        .error(conflict)
        .times(2)
        .output(|| TransactWriteItemsOutput::builder().build())
        .build();
    let store = tasks(&rule);
    let lease = PaidLease {
        holder: "sandbox".into(),
        expires_at_ms: 1,
    };
    let (job, run) = (Id::parse("j").unwrap(), Id::parse("r").unwrap());

    // Act
    let answer = store
        .reserve_paid(RunRef::new(&job, &run), &lease, 1024)
        .await;

    // Assert
    assert_eq!(answer.expect("granted"), Reservation::Granted);
    assert_eq!(rule.num_calls(), 3);
}

#[tokio::test]
async fn a_transaction_refused_for_an_item_too_large_is_invalid_not_retried_as_is() {
    let store = tasks(&cancelled(&["ValidationError", "None"]));

    let err = store
        .finish(&task(), &failed(), run_counted(), SystemTime::now())
        .await
        .expect_err("invalid");

    assert!(err.is_invalid(), "{err:?}");
}

#[tokio::test]
async fn a_claim_meeting_a_transaction_in_flight_is_a_conflict() {
    let rule = mock!(aws_sdk_dynamodb::Client::update_item).then_http_response(|| {
        http(
            400,
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#TransactionConflictException","message":"Transaction is ongoing for the item"}"#,
        )
    });

    let err = tasks(&rule)
        .claim(&task(), SystemTime::now(), None, TriesFrom::default())
        .await
        .expect_err("a conflict");

    assert!(err.is_conflict(), "{err:?}");
}

/// A `BatchGetItem` answer that leaves the job's key unprocessed.
fn unprocessed() -> BatchGetItemOutput {
    let key = KeysAndAttributes::builder()
        .keys([("pk".to_owned(), AttributeValue::S("JOB#j".into()))].into())
        .build()
        .expect("keys are set");
    BatchGetItemOutput::builder()
        .unprocessed_keys("tasks", key)
        .build()
}

#[tokio::test]
async fn keys_left_unprocessed_round_after_round_count_as_throttling() {
    let rule = mock!(aws_sdk_dynamodb::Client::batch_get_item)
        .sequence()
        .output(unprocessed)
        .repeatedly()
        .build();
    let store = tasks(&rule);

    assert_eq!(
        fault(store.load_parents(&task()).await),
        StoreFault::Throttled
    );
    assert_eq!(rule.num_calls(), 6, "the first ask and five more");
}

#[tokio::test]
async fn keys_left_unprocessed_once_are_asked_for_again() {
    let job = || {
        let item = [
            ("pk".to_owned(), AttributeValue::S("JOB#j".into())),
            ("sk".to_owned(), AttributeValue::S("JOB".into())),
            ("status".to_owned(), AttributeValue::S("active".into())),
        ];
        BatchGetItemOutput::builder()
            .responses("tasks", vec![item.into()])
            .build()
    };
    let rule = mock!(aws_sdk_dynamodb::Client::batch_get_item)
        .sequence()
        .output(unprocessed)
        .output(job)
        .build();
    let store = tasks(&rule);

    let parents = store
        .load_parents(&task())
        .await
        .expect("read on the second ask");

    assert_eq!(parents.job_status.as_deref(), Some("active"));
    assert_eq!(rule.num_calls(), 2);
}

#[tokio::test]
async fn s3_slow_down_is_throttling_a_bare_503_a_failure_and_access_denied_a_refusal() {
    let slow = mock!(aws_sdk_s3::Client::put_object).then_http_response(|| {
        http(
            503,
            "<Error><Code>SlowDown</Code><Message>reduce your rate</Message></Error>",
        )
    });
    let bare = mock!(aws_sdk_s3::Client::head_object).then_http_response(|| http(503, ""));
    let denied = mock!(aws_sdk_s3::Client::head_object).then_http_response(|| {
        http(
            403,
            "<Error><Code>AccessDenied</Code><Message>no</Message></Error>",
        )
    });
    let key = ResultKey::for_task("results/", &task());

    let page = Page {
        url: "http://example.com/".into(),
        http_status: 200,
        final_url: "http://example.com/".into(),
        content_type: "text/html".into(),
        body: "hello".into(),
        validators: Default::default(),
        rendered: None,
        screenshot: None,
    };
    let new = NewResult {
        key: &key,
        page: &page,
        sha256: "00",
        fetched_at: SystemTime::now(),
        shell: None,
    };

    let store = results(&slow);
    assert_eq!(fault(store.put_if_absent(new).await), StoreFault::Throttled);

    let store = results(&bare);
    assert_eq!(fault(store.describe(&key).await), StoreFault::ServiceFailed);

    let store = results(&denied);
    assert!(matches!(
        fault(store.describe(&key).await),
        StoreFault::Refused { .. }
    ));
}

fn page() -> Page {
    Page {
        url: "http://example.com/".into(),
        http_status: 200,
        final_url: "http://example.com/".into(),
        content_type: "text/html".into(),
        body: "hello".into(),
        validators: Default::default(),
        rendered: None,
        screenshot: None,
    }
}

#[tokio::test]
async fn s3_racing_conditional_puts_are_a_conflict_and_oversized_requests_invalid() {
    let racing = mock!(aws_sdk_s3::Client::put_object).then_http_response(|| {
        http(
            409,
            "<Error><Code>ConditionalRequestConflict</Code><Message>try again</Message></Error>",
        )
    });
    let too_big = mock!(aws_sdk_s3::Client::put_object).then_http_response(|| {
        http(
            400,
            "<Error><Code>RequestHeaderSectionTooLarge</Code><Message>8 KB</Message></Error>",
        )
    });
    let (key, page) = (ResultKey::for_task("results/", &task()), page());
    let new = NewResult {
        key: &key,
        page: &page,
        sha256: "00",
        fetched_at: SystemTime::now(),
        shell: None,
    };

    assert_eq!(
        fault(results(&racing).put_if_absent(new).await),
        StoreFault::Conflict
    );
    assert!(matches!(
        fault(results(&too_big).put_if_absent(new).await),
        StoreFault::Invalid { .. }
    ));
}

#[tokio::test]
async fn a_page_s3_refuses_as_invalid_fails_its_task_instead_of_coming_back() {
    let refused = mock!(aws_sdk_s3::Client::put_object).then_http_response(|| {
        http(
            400,
            "<Error><Code>InvalidArgument</Code><Message>no</Message></Error>",
        )
    });
    let written = mock!(aws_sdk_dynamodb::Client::transact_write_items)
        .then_output(|| TransactWriteItemsOutput::builder().build());
    let (tasks, results) = (tasks(&written), results(&refused));
    let conflicts = AtomicU64::new(0);
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let patience = Patience::new(until, RetryPolicy::default(), &conflicts);
    let stores = Stores::new(&tasks, &results, patience, Counting::Run);
    let key = ResultKey::for_task("results/", &task());

    let converged = stores.succeed(&task(), &key, &page(), None).await;

    let Ok(Converged::Failed { reason }) = converged else {
        panic!("{converged:?}");
    };
    assert!(
        reason.starts_with("the result could not be stored"),
        "{reason}"
    );
}

/// A terminal write counted on the run item, with no spend.
fn run_counted() -> CountedIn<'static> {
    CountedIn {
        counting: Counting::Run,
        spend: no_spend(),
    }
}

/// A TCP server that takes connections and never answers.
async fn silent_server() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a local port");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    addr
}

#[tokio::test]
async fn a_proxy_secret_read_that_is_never_answered_fails_as_timed_out() {
    // Arrange: Secrets Manager behind a server that takes the connection and never answers.
    let addr = silent_server().await;
    let sdk = conveyor_testkit::sdk_config_as(&format!("http://{addr}"), "test").await;
    let client = aws_sdk_secretsmanager::Client::new(&sdk);
    let secrets = SecretsManager::new(client).within(std::time::Duration::from_millis(300));
    let arn = "arn:aws:secretsmanager:us-east-1:000000000000:secret:proxies";

    // Act: bounded here too, so a read without its own bound fails the test, not hangs it.
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        secrets.proxy_secret(arn),
    );
    let read = read.await.expect("the read gave up by its own bound");

    // Assert
    let err = read.expect_err("no answer, no secret");
    assert_eq!(err.fault(), Some(&StoreFault::TimedOut), "{err}");
}
