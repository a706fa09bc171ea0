//! A cold start that cannot go on says why to whoever invoked the function: the worker
//! reports it to the Runtime API's init error endpoint before it exits (as Lambda shows it,
//! and `cargo lambda invoke` prints it), instead of a bare exit that leaves the invoker
//! waiting.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::Command;

/// What a stand-in Runtime API received in its first request: the request line, the
/// error-type header and the body.
struct Received {
    line: String,
    error_type: Option<String>,
    body: String,
}

/// Accepts one request on `listener` and answers 202.
async fn receive_one(listener: TcpListener) -> Received {
    let (socket, _) = listener.accept().await.expect("a connection");
    let mut reader = BufReader::new(socket);
    let mut line = String::new();
    reader.read_line(&mut line).await.expect("a request line");
    let (mut length, mut error_type) = (0, None);
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).await.expect("a header");
        let Some((name, value)) = header.trim_end().split_once(": ") else {
            break;
        };
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse().expect("a length"),
            "lambda-runtime-function-error-type" => error_type = Some(value.to_owned()),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.expect("the body");
    let reply = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    reader.get_mut().write_all(reply).await.expect("answer");
    Received {
        line: line.trim_end().to_owned(),
        error_type,
        body: String::from_utf8(body).expect("a UTF-8 body"),
    }
}

#[tokio::test]
async fn a_cold_start_without_its_table_reports_why_to_the_runtime_api_and_exits() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("an address");
    let worker = Command::new(env!("CARGO_BIN_EXE_conveyor-worker"))
        .env("AWS_LAMBDA_RUNTIME_API", address.to_string())
        .env_remove("TABLE_NAME")
        .env("RESULTS_BUCKET", "results")
        .kill_on_drop(true)
        .output();

    let (received, exited) = tokio::join!(receive_one(listener), async {
        tokio::time::timeout(Duration::from_secs(20), worker).await
    });

    assert_eq!(
        received.line,
        "POST /2018-06-01/runtime/init/error HTTP/1.1"
    );
    assert_eq!(received.error_type.as_deref(), Some("Runtime.InitError"));
    let body: serde_json::Value = serde_json::from_str(&received.body).expect("JSON");
    assert_eq!(body["errorType"], "ConfigError");
    assert_eq!(body["errorMessage"], "TABLE_NAME is required but not set");
    let exited = exited.expect("it exits").expect("it ran");
    assert!(!exited.status.success());
}

/// A secret in the emulator holding `text`; its ARN.
pub(crate) async fn secret(text: &str) -> String {
    let sdk = conveyor_testkit::sdk_config(&conveyor_testkit::endpoint()).await;
    let client = aws_sdk_secretsmanager::Client::new(&sdk);
    let out = client
        .create_secret()
        .name(conveyor_testkit::unique("proxy-secret"))
        .secret_string(text)
        .send()
        .await
        .expect("create a secret");
    out.arn().expect("a created secret has an ARN").to_owned()
}

/// The worker's cold start with proxies and `secret_arn`, against a stand-in Runtime API:
/// its first request, and what it printed.
async fn cold_start_with_proxies(secret_arn: &str) -> (Received, String) {
    cold_start_with(PROXIES, secret_arn).await
}

const PROXIES: &str = "http://127.0.0.1:3128;http://127.0.0.1:8000";

/// The worker's cold start with `proxy_urls` and `secret_arn`.
async fn cold_start_with(proxy_urls: &str, secret_arn: &str) -> (Received, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("an address");
    let mut worker = Command::new(env!("CARGO_BIN_EXE_conveyor-worker"))
        .env("AWS_LAMBDA_RUNTIME_API", address.to_string())
        .env("TABLE_NAME", "tasks")
        .env("RESULTS_BUCKET", "results")
        .env("PROXY_URLS", proxy_urls)
        .env("PROXY_SECRET_ARN", secret_arn)
        .env("RUST_LOG", "trace")
        // What Lambda sets, which the runtime reads once the cold start is done.
        .env("AWS_LAMBDA_FUNCTION_NAME", "conveyor-worker")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/conveyor-worker")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "cold-start-test")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the worker");
    let received = tokio::time::timeout(Duration::from_secs(20), receive_one(listener)).await;
    let _ = worker.start_kill();
    let out = worker.wait_with_output().await.expect("it ran");
    let printed =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let received = received.unwrap_or_else(|_| panic!("no request to the Runtime API: {printed}"));
    (received, printed)
}

#[tokio::test]
async fn a_cold_start_reads_the_proxy_secret_and_never_prints_it() {
    let arn = secret(r#"{"username": "u-7f3a", "password": "p-never-printed"}"#).await;

    let (received, printed) = cold_start_with_proxies(&arn).await;

    assert_eq!(
        received.line, "GET /2018-06-01/runtime/invocation/next HTTP/1.1",
        "{printed}"
    );
    assert!(!printed.contains("p-never-printed") && !printed.contains("u-7f3a"));
}

#[tokio::test]
async fn a_cold_start_whose_proxy_secret_is_missing_or_malformed_says_so_without_its_text() {
    let malformed = secret(r#"{"username": "u-7f3a", "pasword": "p-never-printed"}"#).await;
    let missing = malformed.replace("proxy-secret", "no-such-secret");

    for arn in [missing, malformed] {
        let (received, printed) = cold_start_with_proxies(&arn).await;

        assert_eq!(
            received.line,
            "POST /2018-06-01/runtime/init/error HTTP/1.1"
        );
        let body: serde_json::Value = serde_json::from_str(&received.body).expect("JSON");
        assert_eq!(body["errorType"], "ProxySecretError", "{body}");
        let told = body["errorMessage"].as_str().unwrap_or_default();
        assert!(
            !told.contains("p-never-printed") && !told.contains("u-7f3a"),
            "{told}"
        );
        assert!(!printed.contains("p-never-printed"));
    }
}

#[tokio::test]
async fn a_malformed_proxy_url_stops_the_cold_start_without_a_word_of_it_printed() {
    let arn = secret(r#"{"username": "u-7f3a", "password": "p-never-printed"}"#).await;
    let leaky = [
        "socks5://user-s3cr:pw-s3cr@127.0.0.1:1080",
        "http://127.0.0.1:3128;http://user-s3cr@127.0.0.1:8000",
        "http://127.0.0.1:3128/?token=s3cr",
        "http//user-s3cr:pw-s3cr@127.0.0.1",
    ];

    for proxy_urls in leaky {
        let (received, printed) = cold_start_with(proxy_urls, &arn).await;

        let body: serde_json::Value = serde_json::from_str(&received.body).expect("JSON");
        assert_eq!(body["errorType"], "ConfigError", "{body}");
        let told = body["errorMessage"].as_str().unwrap_or_default();
        assert!(told.starts_with("PROXY_URLS is not valid: tier "), "{told}");
        for line in printed.lines().chain([told, received.line.as_str()]) {
            assert!(
                !line.contains("s3cr") && !line.contains("p-never"),
                "{line}"
            );
        }
    }
}
