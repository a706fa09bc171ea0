//! `conveyor-ops replay-quarantine`: sends each quarantined poison message's body back to
//! the queue, once the producer or the worker is fixed, and can delete what was sent. A body
//! that is still poison lands on its own object again, never beside it. Also lists the
//! quarantined messages.

use conveyor_worker::domain::ids::REPLAYED_FROM;
use conveyor_worker::ports::error::StoreError;
use conveyor_worker::store::s3::S3ResultStore;
use conveyor_worker::store::sqs::SqsQueue;

/// What a replay did, by quarantine key.
#[derive(Debug, Default)]
pub struct Replayed {
    pub sent: Vec<String>,
    pub deleted: Vec<String>,
    /// Objects that could not be replayed, and why.
    pub skipped: Vec<(String, String)>,
}

/// Sends each quarantined message's body under `prefix` back to the queue. With `delete`,
/// removes each object once its body is sent. `delete` is how long each message waits in
/// the queue. The wait is longer than the delete takes, so a body that is still poison is
/// quarantined again after the delete, never before it. Before it, the delete would remove
/// the new record.
pub async fn replay_quarantine(
    quarantine: &S3ResultStore,
    prefix: &str,
    queue: &SqsQueue,
    delete: Option<std::time::Duration>,
) -> Result<Replayed, StoreError> {
    let mut replayed = Replayed::default();
    for key in quarantine.keys_under(prefix).await? {
        match original_body(&quarantine.read(&key).await?) {
            Ok(body) => {
                // Tagged with its object's key, so that a body still poison lands on it again.
                let delay = delete.unwrap_or_default();
                queue
                    .send_with(&body, &[(REPLAYED_FROM, &key)], delay)
                    .await?;
                replayed.sent.push(key.clone());
                if delete.is_some() {
                    quarantine.delete(&key).await?;
                    replayed.deleted.push(key);
                }
            }
            Err(why) => replayed.skipped.push((key, why)),
        }
    }
    Ok(replayed)
}

/// One quarantined message, as an operator reads it before replaying.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Quarantined {
    pub key: String,
    pub reason: String,
    pub quarantined_at: String,
    /// The body's first 120 characters.
    pub body: String,
}

/// Every quarantined message under `prefix`, with why it was quarantined.
pub async fn list_quarantine(
    quarantine: &S3ResultStore,
    prefix: &str,
) -> Result<Vec<Quarantined>, StoreError> {
    let mut listed = Vec::new();
    for key in quarantine.keys_under(prefix).await? {
        let document: serde_json::Value =
            serde_json::from_slice(&quarantine.read(&key).await?).unwrap_or_default();
        let text = |v: &serde_json::Value| v.as_str().unwrap_or("?").to_owned();
        listed.push(Quarantined {
            reason: text(&document["reason"]),
            quarantined_at: text(&document["quarantined_at"]),
            body: text(&document["record"]["body"])
                .chars()
                .take(120)
                .collect(),
            key,
        });
    }
    Ok(listed)
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
