//! How a command ends: the exit codes a script can branch on (docs/runbook.md has the
//! table), and an error said as the resource it concerns and the fix, without SDK text.

use std::error::Error;
use std::process::ExitCode;

use aws_credential_types::provider::error::CredentialsError;
use conveyor_worker::ports::error::{StoreError, StoreFault};

/// The exit codes, one per thing a script may want to branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// What was asked happened.
    Done = 0,
    /// Something else went wrong (a stored object that does not match its record, a bug).
    Failed = 1,
    /// The input was refused: a flag, a setting, a list.
    BadInput = 2,
    /// The run or the queue is not done: tasks pending, a stall, a time limit.
    Incomplete = 3,
    /// Messages went to the dead-letter queue.
    DeadLettered = 4,
    /// AWS was out of reach or refused: credentials, a missing table, bucket or queue.
    Aws = 5,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// A command's end that is not [`Exit::Done`], with the line that says why.
#[derive(Debug)]
pub struct Stop {
    pub exit: Exit,
    pub message: String,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for Stop {}

/// A [`Stop`] as a command's error.
pub fn stop(exit: Exit, message: impl Into<String>) -> Box<dyn Error> {
    Box::new(Stop {
        exit,
        message: message.into(),
    })
}

/// The resources a command names, and whether a region is set, for its errors.
#[derive(Debug, Default, Clone)]
pub struct Named {
    pub table: Option<String>,
    pub bucket: Option<String>,
    pub queue_url: Option<String>,
    /// The AWS settings name no region: a request cannot be signed.
    pub region_missing: bool,
}

/// The exit code of a command's error and the line that explains it.
pub fn ending(err: &(dyn Error + 'static), named: &Named) -> (Exit, String) {
    if let Some(stop) = err.downcast_ref::<Stop>() {
        return (stop.exit, stop.message.clone());
    }
    match find::<StoreError>(err) {
        Some(aws @ StoreError::Failed { .. }) => return (Exit::Aws, aws_line(aws, named)),
        // The stored state refuses what was asked (no such run, a cancelled one).
        Some(refused @ StoreError::NotAllowed { .. }) => {
            return (Exit::BadInput, refused.to_string());
        }
        Some(other) => return (Exit::Failed, other.to_string()),
        None => {}
    }
    if find::<conveyor_worker::wiring::config::ConfigError>(err).is_some() {
        return (Exit::BadInput, explain(err));
    }
    (Exit::Failed, explain(err))
}

fn find<'a, T: Error + 'static>(err: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(found) = err.downcast_ref::<T>() {
            return Some(found);
        }
        current = err.source();
    }
    None
}

/// An AWS error as the resource and the fix.
fn aws_line(err: &StoreError, named: &Named) -> String {
    let StoreError::Failed {
        operation, fault, ..
    } = err
    else {
        return err.to_string();
    };
    let (what, flag) = resource(operation, named);
    match fault {
        StoreFault::Refused { code } if missing(code) => {
            format!("{what} does not exist ({code}): check {flag} and AWS_REGION")
        }
        StoreFault::Refused { code }
            if code.contains("AccessDenied")
                || code.contains("Unauthorized")
                || code.contains("Forbidden") =>
        {
            format!(
                "{what}: access denied ({code}): the credentials' policy must allow {operation}"
            )
        }
        StoreFault::Refused { code }
            if code.contains("Token")
                || code.contains("Signature")
                || code.contains("Credential") =>
        {
            format!(
                "{what}: the credentials were refused ({code}): check AWS_PROFILE or AWS_ACCESS_KEY_ID"
            )
        }
        StoreFault::NotSent if named.region_missing => {
            "no AWS region (missing signing region): set AWS_REGION".to_owned()
        }
        StoreFault::NotSent if find::<CredentialsError>(err).is_some() => {
            "no credentials: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
             or run where a role provides them"
                .to_owned()
        }
        StoreFault::NotSent | StoreFault::TimedOut => {
            let endpoint = std::env::var("AWS_ENDPOINT_URL").unwrap_or_else(|_| "AWS".into());
            format!(
                "{what}: {endpoint} did not answer ({}): check the network or AWS_ENDPOINT_URL",
                root_cause(err)
            )
        }
        _ => format!("{what}: {operation} {fault}"),
    }
}

/// An AWS code that says the resource is not there.
fn missing(code: &str) -> bool {
    ["NotFound", "NoSuch", "NonExistent", "DoesNotExist"]
        .iter()
        .any(|word| code.contains(word))
}

/// The resource an operation reads or writes, and the flag that names it.
fn resource(operation: &str, named: &Named) -> (String, &'static str) {
    let service = operation.split('(').next().unwrap_or_default();
    let some = |name: &Option<String>| name.clone().unwrap_or_else(|| "?".into());
    if service.ends_with("Object")
        || service.starts_with("ListObjects")
        || service.ends_with("Bucket")
    {
        (
            format!("bucket {}", some(&named.bucket)),
            "--bucket (RESULTS_BUCKET)",
        )
    } else if service.contains("Message") || service.starts_with("GetQueue") {
        (
            format!("queue {}", some(&named.queue_url)),
            "--queue-url (QUEUE_URL)",
        )
    } else if service == "GetSecretValue" {
        ("the proxy secret".into(), "PROXY_SECRET_ARN")
    } else {
        (
            format!("table {}", some(&named.table)),
            "--table (TABLE_NAME)",
        )
    }
}

/// The innermost cause of an error ("Connection refused (os error 111)").
fn root_cause(err: &(dyn Error + 'static)) -> String {
    let mut current = err;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

/// An error with every cause under it, each said once.
pub fn explain(err: &(dyn Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        let said = next.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = next.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_names_the_resource_it_touches_and_the_flag_that_sets_it() {
        let named = Named {
            table: Some("t".into()),
            bucket: Some("b".into()),
            queue_url: Some("q".into()),
            region_missing: false,
        };
        let cases = [
            ("GetItem(run)", "table t", "--table (TABLE_NAME)"),
            (
                "TransactWriteItems(requeue)",
                "table t",
                "--table (TABLE_NAME)",
            ),
            ("HeadObject", "bucket b", "--bucket (RESULTS_BUCKET)"),
            ("HeadBucket", "bucket b", "--bucket (RESULTS_BUCKET)"),
            ("ListObjectsV2", "bucket b", "--bucket (RESULTS_BUCKET)"),
            ("ReceiveMessage", "queue q", "--queue-url (QUEUE_URL)"),
            ("GetQueueAttributes", "queue q", "--queue-url (QUEUE_URL)"),
        ];
        for (operation, what, flag) in cases {
            assert_eq!(
                resource(operation, &named),
                (what.to_owned(), flag),
                "{operation}"
            );
        }
    }

    #[test]
    fn a_stop_keeps_its_code_refusals_are_bad_input_and_the_rest_fails() {
        let named = Named::default();
        let refused = StoreError::NotAllowed {
            detail: "run j/r does not exist".into(),
        };
        let other = std::io::Error::other("disk full");

        assert_eq!(
            ending(stop(Exit::Incomplete, "3 left").as_ref(), &named).0,
            Exit::Incomplete
        );
        assert_eq!(ending(&refused, &named).0, Exit::BadInput);
        assert_eq!(
            ending(&other, &named),
            (Exit::Failed, "disk full".to_owned())
        );
        assert!(missing("AWS.SimpleQueueService.NonExistentQueue") && missing("NoSuchBucket"));
        assert!(!missing("AccessDenied"));
    }
}
