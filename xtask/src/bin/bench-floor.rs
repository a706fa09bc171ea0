//! The cold-start floor for `make bench`: the smallest lambda_runtime function, which does
//! nothing, started the same way as the worker.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(|_: LambdaEvent<Value>| async {
        Ok::<_, Error>(Value::Null)
    }))
    .await
}
