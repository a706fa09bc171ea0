//! Whether the object already stored under a key is a block page. The adopt paths and a
//! refresh's earlier result ask this before they use a stored object: a block page is never
//! a result.

use crate::domain::blocks::{BODY_WINDOW, Detection};
use crate::domain::ids::ResultKey;
use crate::domain::model::StoredResult;
use crate::ports::error::StoreError;
use crate::ports::results::ResultStore;

/// The version of the object under `key`, described by `stored`, if `detection` finds it a
/// block page. Neither adopted nor carried forward then.
pub(super) async fn stored_block<R: ResultStore>(
    results: &R,
    detection: &Detection,
    key: &ResultKey,
    stored: &StoredResult,
) -> Result<Option<String>, StoreError> {
    if detection.is_off() {
        return Ok(None);
    }
    let Some(opening) = results.opening(key, BODY_WINDOW).await? else {
        return Ok(None);
    };
    let typed = Some(stored.content_type.as_str()).filter(|t| !t.is_empty());
    let Some(block) = detection.by_body(typed, &opening.bytes) else {
        return Ok(None);
    };
    tracing::warn!(%key, %block, "the stored object is a block page: never a result");
    Ok(Some(opening.etag))
}
