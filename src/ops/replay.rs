//! `conveyor-ops replay-quarantine`: each quarantined poison message's body sent back to the
//! queue (once the producer or the worker is fixed), optionally deleting what was sent.

use crate::ports::error::AwsError;
use crate::store::s3::S3ResultStore;
use crate::store::sqs::SqsQueue;

/// What a replay did, by quarantine key.
#[derive(Debug, Default)]
pub struct Replayed {
    pub sent: Vec<String>,
    pub deleted: Vec<String>,
    /// Objects that could not be replayed, and why.
    pub skipped: Vec<(String, String)>,
}

/// Sends each quarantined message's body under `prefix` back to the queue; with `delete`,
/// removes each object once its body is sent.
pub async fn replay_quarantine(
    quarantine: &S3ResultStore,
    prefix: &str,
    queue: &SqsQueue,
    delete: bool,
) -> Result<Replayed, AwsError> {
    let mut replayed = Replayed::default();
    for key in quarantine.keys_under(prefix).await? {
        match original_body(&quarantine.read(&key).await?) {
            Ok(body) => {
                queue.send(&body).await?;
                replayed.sent.push(key.clone());
                if delete {
                    quarantine.delete(&key).await?;
                    replayed.deleted.push(key);
                }
            }
            Err(why) => replayed.skipped.push((key, why)),
        }
    }
    Ok(replayed)
}

/// The original body of a quarantine document, or why it cannot be replayed.
fn original_body(document: &[u8]) -> Result<String, String> {
    let document: serde_json::Value =
        serde_json::from_slice(document).map_err(|e| format!("not a quarantine document: {e}"))?;
    match document["record"]["body"].as_str() {
        Some(body) => Ok(body.to_owned()),
        None => Err("the quarantined message had no body".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_original_body_is_read_from_a_quarantine_document() {
        let document = br#"{"reason":"not JSON","record":{"body":"{oops"}}"#;
        assert_eq!(original_body(document), Ok("{oops".into()));
        assert!(original_body(b"{}").is_err());
        assert!(original_body(b"not json").is_err());
    }
}
