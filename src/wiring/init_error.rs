//! A cold start that cannot go on, reported to the Lambda Runtime API's init error endpoint,
//! so whoever invoked the function sees why.

/// A cold start that cannot go on. It is logged, and reported to the Runtime API's init
/// error endpoint (`Runtime.InitError` with the reason). So whoever invoked the function
/// (Lambda's console and logs, `cargo lambda invoke`) sees why, rather than a bare exit.
/// Returns the error to end `main` with.
pub async fn fail_init<E>(kind: &'static str, err: E) -> lambda_runtime::Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    tracing::error!(error = %err, "cold start failed");
    if let Err(report) = report_init_error(kind, &err.to_string()).await {
        tracing::warn!(error = %report, "could not report the cold start's failure");
    }
    Box::new(err)
}

/// `POST /2018-06-01/runtime/init/error` with a Diagnostic body.
async fn report_init_error(kind: &str, message: &str) -> Result<(), lambda_runtime::Error> {
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_none() {
        return Ok(()); // not under a Lambda runtime: the log line is all there is
    }
    let client = lambda_runtime_api_client::Client::builder().build()?;
    let body = serde_json::json!({ "errorType": kind, "errorMessage": message });
    let request = lambda_runtime_api_client::build_request()
        .method("POST")
        .uri("/2018-06-01/runtime/init/error")
        .header("Lambda-Runtime-Function-Error-Type", "Runtime.InitError")
        .header("Content-Type", "application/json")
        .body(body.to_string().into())?;
    let response = client.call(request).await?;
    if !response.status().is_success() {
        return Err(format!("the runtime API answered {}", response.status()).into());
    }
    Ok(())
}
