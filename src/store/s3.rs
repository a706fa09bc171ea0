//! The result store's S3 adapter (`ports::results::ResultStore`): the first object stored
//! under a task's key wins (`If-None-Match: *`).

use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;

use crate::domain::bounds::MetadataUrl;
use crate::domain::ids::{QuarantineKey, ResultKey};
use crate::domain::model::StoredResult;
use crate::domain::time::rfc3339;
use crate::ports::error::AwsError;
use crate::ports::results::{NewResult, Put, ResultStore};
use crate::store::error::service_code;

/// User metadata names on every result object.
pub mod meta {
    pub const SOURCE_URL: &str = "source-url";
    pub const FINAL_URL: &str = "final-url";
    pub const HTTP_STATUS: &str = "http-status";
    pub const SHA256: &str = "sha256";
    pub const FETCHED_AT: &str = "fetched-at";
}

/// [`ResultStore`] on one S3 bucket.
#[derive(Debug, Clone)]
pub struct S3ResultStore {
    client: Client,
    bucket: String,
}

impl S3ResultStore {
    pub fn new(client: Client, bucket: impl Into<String>) -> Self {
        Self {
            client,
            bucket: bucket.into(),
        }
    }
}

impl ResultStore for S3ResultStore {
    #[tracing::instrument(skip_all, fields(key = %new.key, size = new.page.body.len()))]
    async fn put_if_absent(&self, new: NewResult<'_>) -> Result<Put, AwsError> {
        let result = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(new.key.as_str())
            .if_none_match("*")
            .body(ByteStream::from(new.page.body.clone()))
            .content_type(new.page.content_type.as_str())
            .metadata(meta::SOURCE_URL, MetadataUrl::new(&new.page.url).as_str())
            .metadata(
                meta::FINAL_URL,
                MetadataUrl::new(&new.page.final_url).as_str(),
            )
            .metadata(meta::HTTP_STATUS, new.page.http_status.to_string())
            .metadata(meta::SHA256, new.sha256)
            .metadata(meta::FETCHED_AT, rfc3339(new.fetched_at))
            .send()
            .await;
        match result {
            Ok(_) => Ok(Put::Stored),
            Err(err) if service_code(&err) == Some("PreconditionFailed") => Ok(Put::AlreadyThere),
            Err(err) => Err(AwsError::from_sdk("PutObject", err)),
        }
    }

    #[tracing::instrument(skip_all, fields(%key))]
    async fn describe(&self, key: &ResultKey) -> Result<Option<StoredResult>, AwsError> {
        let head = match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key.as_str())
            .send()
            .await
        {
            Ok(head) => head,
            Err(err) if err.as_service_error().is_some_and(|e| e.is_not_found()) => {
                return Ok(None);
            }
            Err(err) => return Err(AwsError::from_sdk("HeadObject", err)),
        };
        let corrupt = |detail: String| AwsError::Corrupt {
            what: "result object",
            detail: format!("{key}: {detail}"),
        };
        let metadata = head.metadata.unwrap_or_default();
        let field = |name: &str| {
            metadata
                .get(name)
                .cloned()
                .ok_or_else(|| corrupt(format!("no {name} metadata")))
        };
        let http_status = field(meta::HTTP_STATUS)?;
        Ok(Some(StoredResult {
            key: key.clone(),
            sha256: field(meta::SHA256)?,
            size: head
                .content_length
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| corrupt("no content length".into()))?,
            http_status: http_status
                .parse()
                .map_err(|_| corrupt(format!("http-status {http_status:?}")))?,
            content_type: head.content_type.unwrap_or_default().into(),
            final_url: field(meta::FINAL_URL)?.into(),
        }))
    }

    #[tracing::instrument(skip_all, fields(key = key.as_str()))]
    async fn quarantine(&self, key: &QuarantineKey, document: Vec<u8>) -> Result<(), AwsError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key.as_str())
            .content_type("application/json")
            .body(ByteStream::from(document))
            .send()
            .await
            .map_err(|e| AwsError::from_sdk("PutObject(quarantine)", e))?;
        Ok(())
    }
}

/// What operators do with the quarantine.
impl S3ResultStore {
    /// The keys under `prefix`, every page of them.
    pub async fn keys_under(&self, prefix: &str) -> Result<Vec<String>, AwsError> {
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        let mut keys = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| AwsError::from_sdk("ListObjectsV2", e))?;
            keys.extend(
                page.contents()
                    .iter()
                    .filter_map(|o| o.key().map(str::to_owned)),
            );
        }
        Ok(keys)
    }

    /// The object's bytes.
    pub async fn read(&self, key: &str) -> Result<Vec<u8>, AwsError> {
        let object = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| AwsError::from_sdk("GetObject", e))?;
        let bytes = object.body.collect().await.map_err(|e| AwsError::Corrupt {
            what: "object body",
            detail: format!("{key}: {e}"),
        })?;
        Ok(bytes.to_vec())
    }

    pub async fn delete(&self, key: &str) -> Result<(), AwsError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| AwsError::from_sdk("DeleteObject", e))?;
        Ok(())
    }
}
