//! The result store's S3 adapter (`ports::results::ResultStore`). The first object stored
//! under a task's key wins (`If-None-Match: *`). Every object carries the SHA-256 of its
//! bytes as S3's own checksum. An earlier result is checked by that checksum before it is
//! copied forward. The copy is server-side, and conditional on the earlier object's version
//! and on the key being empty (or, to replace a stored block page, on that page's version).

use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;

use aws_sdk_s3::operation::head_object::HeadObjectOutput;
use aws_sdk_s3::types::{ChecksumAlgorithm, ChecksumMode, MetadataDirective};
use base64::Engine as _;

use crate::domain::bounds::{Bounded, MetadataUrl};
use crate::domain::ids::{QuarantineKey, ResultKey};
use crate::domain::model::StoredResult;
use crate::domain::refresh::{Prior, Validators};
use crate::domain::render::Rendering;
use crate::domain::shells::ShellRule;
use crate::domain::time::rfc3339;
use crate::ports::error::{StoreError, StoreFault};
use crate::ports::results::{
    Carried, Copied, Earlier, EarlierCheck, NewResult, Opening, Put, ResultStore,
};
use crate::store::error::service_code;
use crate::store::lazy::Lazy;

/// User metadata names on every result object.
pub mod meta {
    pub const SOURCE_URL: &str = "source-url";
    pub const FINAL_URL: &str = "final-url";
    pub const HTTP_STATUS: &str = "http-status";
    pub const SHA256: &str = "sha256";
    pub const FETCHED_AT: &str = "fetched-at";
    pub const ETAG: &str = "etag";
    pub const LAST_MODIFIED: &str = "last-modified";
    /// On an object carried forward on a `304 Not Modified`: the earlier object's key.
    pub const REFRESHED_FROM: &str = "refreshed-from";
    /// On an application shell: the rule it met.
    pub const SHELL: &str = "shell";
    /// On a page rendered in a browser: what it asked for (`requests=N bytes=M`).
    pub const RENDERED: &str = "rendered";
    /// On a rendered page with a PNG beside it (`render_screenshot`): `png`.
    pub const SCREENSHOT: &str = "screenshot";
}

/// [`ResultStore`] on one S3 bucket.
#[derive(Debug, Clone)]
pub struct S3ResultStore {
    client: Lazy<Client>,
    bucket: String,
}

impl S3ResultStore {
    pub fn new(client: impl Into<Lazy<Client>>, bucket: impl Into<String>) -> Self {
        Self {
            client: client.into(),
            bucket: bucket.into(),
        }
    }
}

impl ResultStore for S3ResultStore {
    #[tracing::instrument(skip_all, fields(key = %new.key, size = new.page.body.len()))]
    async fn put_if_absent(&self, new: NewResult<'_>) -> Result<Put, StoreError> {
        self.put_screenshot(&new).await?;
        let result = self.put(new).if_none_match("*").send().await;
        match result {
            Ok(_) => Ok(Put::Stored),
            Err(err) if service_code(&err) == Some("PreconditionFailed") => Ok(Put::AlreadyThere),
            Err(err) => Err(StoreError::from_sdk("PutObject", err)),
        }
    }

    #[tracing::instrument(skip_all, fields(key = %new.key))]
    async fn replace(&self, new: NewResult<'_>, etag: &str) -> Result<Put, StoreError> {
        // The SDK's futures are boxed, here and in `opening`. They are large in a debug
        // build, and these rare calls sit inside every delivery's converge stage.
        Box::pin(self.put_screenshot(&new)).await?;
        let result = Box::pin(self.put(new).if_match(etag).send()).await;
        match result {
            Ok(_) => Ok(Put::Stored),
            // Gone (404) or another version (412): not the object that was checked.
            Err(err) if matches!(service_code(&err), Some("PreconditionFailed" | "NoSuchKey")) => {
                Ok(Put::AlreadyThere)
            }
            Err(err) => Err(StoreError::from_sdk("PutObject(replace)", err)),
        }
    }

    #[tracing::instrument(skip_all, fields(%key))]
    async fn opening(&self, key: &ResultKey, most: usize) -> Result<Option<Opening>, StoreError> {
        let request = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key.as_str());
        let ranged = request.range(format!("bytes=0-{}", most.max(1) - 1));
        let result = Box::pin(ranged.send()).await;
        let out = match result {
            Ok(out) => out,
            Err(err) if err.as_service_error().is_some_and(|e| e.is_no_such_key()) => {
                return Ok(None);
            }
            // An empty object has no byte 0.
            Err(err) if service_code(&err) == Some("InvalidRange") => {
                let head = Box::pin(self.head(key, false)).await?;
                let etag = head.and_then(|head| head.e_tag);
                return Ok(etag.map(|etag| Opening {
                    bytes: Vec::new(),
                    etag,
                }));
            }
            Err(err) => return Err(StoreError::from_sdk("GetObject(range)", err)),
        };
        let etag = out.e_tag.clone().unwrap_or_default();
        let body = (out.body.collect().await)
            .map_err(|e| StoreError::failed("GetObject(range)", StoreFault::ServiceFailed, e))?;
        let mut bytes = body.to_vec();
        bytes.truncate(most);
        Ok(Some(Opening { bytes, etag }))
    }

    #[tracing::instrument(skip_all, fields(%key))]
    async fn describe(&self, key: &ResultKey) -> Result<Option<StoredResult>, StoreError> {
        match self.head(key, false).await? {
            Some(head) => described(key, &head).map(Some),
            None => Ok(None),
        }
    }

    #[tracing::instrument(skip_all, fields(key = %prior.key))]
    async fn check_earlier(&self, prior: &Prior) -> Result<EarlierCheck, StoreError> {
        let Some(head) = self.head(&prior.key, true).await? else {
            return Ok(EarlierCheck::Unusable("the earlier result is gone".into()));
        };
        let checksum = head.checksum_sha256.as_deref().and_then(hex_of_base64);
        let Some(checksum) = checksum else {
            return Ok(EarlierCheck::Unusable(
                "the earlier result has no SHA-256 checksum".into(),
            ));
        };
        // Stored without the metadata the worker writes (by hand, or by another tool). Then
        // there is nothing to describe the copy by, so the page is fetched in full.
        let stored = match described(&prior.key, &head) {
            Ok(stored) => stored,
            Err(err) => return Ok(EarlierCheck::Unusable(err.to_string())),
        };
        if checksum != prior.sha256.as_str() || stored.sha256 != prior.sha256.as_str() {
            return Ok(EarlierCheck::Unusable(
                "the earlier result's bytes are not the ones its task names".into(),
            ));
        }
        let version = head.e_tag.clone().unwrap_or_default();
        Ok(EarlierCheck::Usable(Box::new(Earlier { version, stored })))
    }

    #[tracing::instrument(skip_all, fields(key = %carried.key))]
    async fn carry_if_absent(&self, carried: Carried<'_>) -> Result<Copied, StoreError> {
        let result = self.copy(carried).if_none_match("*").send().await;
        match result {
            Ok(_) => Ok(Copied::Stored),
            // The key was taken, or the earlier object changed. A look at the key tells which.
            Err(err) if service_code(&err) == Some("PreconditionFailed") => {
                match self.head(carried.key, false).await? {
                    Some(_) => Ok(Copied::AlreadyThere),
                    None => Ok(Copied::EarlierChanged),
                }
            }
            Err(err) => Err(StoreError::from_sdk("CopyObject", err)),
        }
    }

    #[tracing::instrument(skip_all, fields(key = %carried.key))]
    async fn carry_replacing(
        &self,
        carried: Carried<'_>,
        etag: &str,
    ) -> Result<Copied, StoreError> {
        // Boxed, as in `replace`: a rare call inside every delivery's converge stage.
        let result = Box::pin(self.copy(carried).if_match(etag).send()).await;
        match result {
            Ok(_) => Ok(Copied::Stored),
            // Gone (404), or one of the two versions changed. A look at the key tells which.
            Err(err) if service_code(&err) == Some("NoSuchKey") => Ok(Copied::AlreadyThere),
            Err(err) if service_code(&err) == Some("PreconditionFailed") => {
                let head = Box::pin(self.head(carried.key, false)).await?;
                match head.and_then(|head| head.e_tag) {
                    Some(now) if now == etag => Ok(Copied::EarlierChanged),
                    _ => Ok(Copied::AlreadyThere),
                }
            }
            Err(err) => Err(StoreError::from_sdk("CopyObject(replace)", err)),
        }
    }

    #[tracing::instrument(skip_all, fields(key = key.as_str()))]
    async fn quarantine(&self, key: &QuarantineKey, document: Vec<u8>) -> Result<(), StoreError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key.as_str())
            .content_type("application/json")
            .body(ByteStream::from(document))
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("PutObject(quarantine)", e))?;
        Ok(())
    }
}

/// The earlier key, as the carried-forward copy's metadata names it. S3 caps user metadata
/// at 2 KB in total, keys and values: two URLs of 560, validators of 232, this, a shell
/// rule of 64, a rendering of 46 and the rest come to 2,032 bytes at most.
type Refreshed = Bounded<400>;

impl S3ResultStore {
    /// The object's head (with its checksum if `checksum`), or `None` when there is none.
    async fn head(
        &self,
        key: &ResultKey,
        checksum: bool,
    ) -> Result<Option<HeadObjectOutput>, StoreError> {
        let mut request = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key.as_str());
        if checksum {
            request = request.checksum_mode(ChecksumMode::Enabled);
        }
        match request.send().await {
            Ok(head) => Ok(Some(head)),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_not_found()) => Ok(None),
            Err(err) => Err(StoreError::from_sdk("HeadObject", err)),
        }
    }
}

impl S3ResultStore {
    /// The rendered page's PNG, if it has one, put before the page: a stored page that says
    /// it has one has it. The first one put stays, so the page that wins a race of
    /// duplicate deliveries keeps its own (it put its PNG before its page).
    async fn put_screenshot(&self, new: &NewResult<'_>) -> Result<(), StoreError> {
        let Some(png) = &new.page.screenshot else {
            return Ok(());
        };
        let key = new.key.screenshot();
        let request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key.as_str())
            .body(ByteStream::from(png.clone()))
            .content_type("image/png")
            .metadata(meta::SOURCE_URL, MetadataUrl::new(&new.page.url).as_str());
        match request.if_none_match("*").send().await {
            Ok(_) => Ok(()),
            Err(err) if service_code(&err) == Some("PreconditionFailed") => Ok(()),
            Err(err) => Err(StoreError::from_sdk("PutObject(screenshot)", err)),
        }
    }

    /// A carried-forward result's `CopyObject`: conditional on the earlier object's version,
    /// with every header except the condition on the key.
    fn copy(
        &self,
        carried: Carried<'_>,
    ) -> aws_sdk_s3::operation::copy_object::builders::CopyObjectFluentBuilder {
        let earlier = &carried.earlier.stored;
        let source = format!("{}/{}", self.bucket, encoded(earlier.key.as_str()));
        let request = self
            .client
            .copy_object()
            .bucket(&self.bucket)
            .key(carried.key.as_str())
            .copy_source(source)
            .copy_source_if_match(&carried.earlier.version)
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .metadata_directive(MetadataDirective::Replace)
            .content_type(earlier.content_type.as_str())
            .metadata(meta::SOURCE_URL, MetadataUrl::new(carried.url).as_str())
            .metadata(
                meta::FINAL_URL,
                MetadataUrl::new(&earlier.final_url).as_str(),
            )
            .metadata(meta::HTTP_STATUS, earlier.http_status.to_string())
            .metadata(meta::SHA256, &earlier.sha256)
            .metadata(meta::FETCHED_AT, rfc3339(carried.fetched_at))
            .metadata(
                meta::REFRESHED_FROM,
                Refreshed::new(earlier.key.as_str()).as_str(),
            );
        let request = marked(request, earlier.shell.as_ref(), earlier.rendered);
        with_validators(request, carried.validators)
    }

    /// A result's `PutObject`, with every header except its condition.
    fn put(
        &self,
        new: NewResult<'_>,
    ) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
        let request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(new.key.as_str())
            .body(ByteStream::from(new.page.body.clone()))
            .content_type(new.page.content_type.as_str())
            // S3 checks the bytes against it and keeps it, as a later refresh's proof of them.
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .checksum_sha256(base64_of_hex(new.sha256))
            .metadata(meta::SOURCE_URL, MetadataUrl::new(&new.page.url).as_str())
            .metadata(
                meta::FINAL_URL,
                MetadataUrl::new(&new.page.final_url).as_str(),
            )
            .metadata(meta::HTTP_STATUS, new.page.http_status.to_string())
            .metadata(meta::SHA256, new.sha256)
            .metadata(meta::FETCHED_AT, rfc3339(new.fetched_at));
        let mut request = marked(request, new.shell, new.page.rendered);
        if new.page.screenshot.is_some() {
            request = request.metadata(meta::SCREENSHOT, "png");
        }
        with_validators(request, &new.page.validators)
    }
}

/// A put or a copy with the validators it stores as metadata.
fn with_validators<B: WithMetadata>(request: B, validators: &Validators) -> B {
    let mut request = request;
    if let Some(etag) = &validators.etag {
        request = request.with_metadata(meta::ETAG, etag.as_str());
    }
    if let Some(date) = &validators.last_modified {
        request = request.with_metadata(meta::LAST_MODIFIED, date.as_str());
    }
    request
}

/// A put or a copy with the page's marks: the application shell rule it met, and its
/// rendering.
fn marked<B: WithMetadata>(
    request: B,
    shell: Option<&ShellRule>,
    rendered: Option<Rendering>,
) -> B {
    let mut request = request;
    if let Some(rule) = shell {
        request = request.with_metadata(meta::SHELL, rule.as_str());
    }
    if let Some(rendering) = rendered {
        request = request.with_metadata(meta::RENDERED, &rendering.to_meta());
    }
    request
}

/// The requests that take user metadata.
trait WithMetadata {
    fn with_metadata(self, name: &str, value: &str) -> Self;
}

impl WithMetadata for aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
    fn with_metadata(self, name: &str, value: &str) -> Self {
        self.metadata(name, value)
    }
}

impl WithMetadata for aws_sdk_s3::operation::copy_object::builders::CopyObjectFluentBuilder {
    fn with_metadata(self, name: &str, value: &str) -> Self {
        self.metadata(name, value)
    }
}

/// A result object as its head and metadata describe it.
fn described(key: &ResultKey, head: &HeadObjectOutput) -> Result<StoredResult, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        what: "result object",
        detail: format!("{key}: {detail}"),
    };
    let metadata = head.metadata.clone().unwrap_or_default();
    let field = |name: &str| {
        metadata
            .get(name)
            .cloned()
            .ok_or_else(|| corrupt(format!("no {name} metadata")))
    };
    let http_status = field(meta::HTTP_STATUS)?;
    let validators = Validators::parse(
        metadata.get(meta::ETAG).map(String::as_str),
        metadata.get(meta::LAST_MODIFIED).map(String::as_str),
    );
    Ok(StoredResult {
        key: key.clone(),
        sha256: field(meta::SHA256)?,
        size: head
            .content_length
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| corrupt("no content length".into()))?,
        http_status: http_status
            .parse()
            .map_err(|_| corrupt(format!("http-status {http_status:?}")))?,
        content_type: head.content_type.clone().unwrap_or_default().into(),
        final_url: field(meta::FINAL_URL)?.into(),
        validators,
        not_modified: metadata.contains_key(meta::REFRESHED_FROM),
        shell: metadata.get(meta::SHELL).map(|rule| ShellRule::new(rule)),
        rendered: metadata
            .get(meta::RENDERED)
            .map(|r| Rendering::from_meta(r)),
        render_reason: None,
    })
}

/// A hex SHA-256 as S3's `x-amz-checksum-sha256` takes it (base64 of the bytes).
fn base64_of_hex(sha256: &str) -> String {
    let bytes = hex::decode(sha256).unwrap_or_default();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The hex SHA-256 of a full-object checksum S3 gives (base64), if it is one.
fn hex_of_base64(checksum: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(checksum)
        .ok()?;
    (bytes.len() == 32).then(|| hex::encode(bytes))
}

/// A key as `x-amz-copy-source` takes it: percent-encoded, its slashes kept.
fn encoded(key: &str) -> String {
    const KEPT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'/')
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(key, KEPT).to_string()
}

/// What operators do with the quarantine.
impl S3ResultStore {
    /// The keys under `prefix`, every page of them.
    pub async fn keys_under(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        let mut keys = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| StoreError::from_sdk("ListObjectsV2", e))?;
            keys.extend(
                page.contents()
                    .iter()
                    .filter_map(|o| o.key().map(str::to_owned)),
            );
        }
        Ok(keys)
    }

    /// The object's bytes.
    pub async fn read(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.read_if_there(key)
            .await?
            .ok_or_else(|| StoreError::Changed {
                detail: format!("the object at {key} is gone"),
            })
    }

    /// Checks that the bucket exists and may be read (HeadBucket), so a missing bucket is
    /// reported before any object.
    pub async fn check_bucket(&self) -> Result<(), StoreError> {
        self.client
            .head_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("HeadBucket", e))?;
        Ok(())
    }

    /// The object's bytes, or `None` when the bucket has no object at `key`.
    pub async fn read_if_there(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let sent = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await;
        let object = match sent {
            Ok(object) => object,
            Err(err) if err.as_service_error().is_some_and(|e| e.is_no_such_key()) => {
                return Ok(None);
            }
            Err(err) => return Err(StoreError::from_sdk("GetObject", err)),
        };
        let bytes = object
            .body
            .collect()
            .await
            .map_err(|e| StoreError::Corrupt {
                what: "object body",
                detail: format!("{key}: {e}"),
            })?;
        Ok(Some(bytes.to_vec()))
    }

    pub async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| StoreError::from_sdk("DeleteObject", e))?;
        Ok(())
    }
}
