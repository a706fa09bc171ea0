//! Converge: every delivery of a task lands on one S3 key, and the task record always
//! describes the object that is actually stored there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::domain::blocks::Detection;
use crate::domain::bounds::Reason;
use crate::domain::ids::{ResultKey, TaskRef};
use crate::domain::model::{Counting, Failure, Page, StoredResult, Terminal};
use crate::domain::refresh::Validators;
use crate::domain::shells::ShellRule;
use crate::domain::spend::{CountedIn, DeliverySpend, Spend};
use crate::ports::error::StoreError;
use crate::ports::results::{Carried, Copied, Earlier, NewResult, Put, ResultStore};
use crate::ports::tasks::{Finish, TaskStore};
use crate::pushback::retry::{FINISH_THROTTLED, Patience};

use crate::worker::blocked;

/// What the terminal write recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Converged {
    /// The task is successful; `adopted` when the stored object came from another delivery.
    Succeeded { adopted: bool },
    /// The task is failed with this reason.
    Failed { reason: String },
    /// Another delivery had already made the terminal write.
    LostRace,
}

/// The stores a task converges in, how long a conflicting write may be retried, how the
/// task's run counts it, and what the delivery's fetch spent. The spend is added to the
/// run's count in the terminal write, when that write is made.
pub struct Stores<'a, T, R> {
    pub tasks: &'a T,
    pub results: &'a R,
    pub patience: Patience<'a>,
    pub counting: Counting,
    pub spend: Spend,
    /// The delivery that spent `spend` (its idempotency token).
    pub delivery: String,
    /// Why the task was handed over to the renderer, if it was: written with a rendered
    /// result.
    pub render_reason: Option<ShellRule>,
    /// How the job's pages are checked for block pages. An object stored by another
    /// delivery (or an earlier release) is adopted only if it is not a block page.
    pub detection: Detection,
    /// The terminal write counted `spend`.
    spend_counted: AtomicBool,
}

impl<'a, T, R> Stores<'a, T, R> {
    pub fn new(tasks: &'a T, results: &'a R, patience: Patience<'a>, counting: Counting) -> Self {
        Self {
            tasks,
            results,
            patience,
            counting,
            spend: Spend::default(),
            delivery: String::new(),
            render_reason: None,
            detection: Detection::default(),
            spend_counted: AtomicBool::new(false),
        }
    }

    /// The stores as one delivery writes to them: what its fetch spent (`spend`), named by
    /// the delivery, is counted in the terminal write.
    pub fn for_delivery(self, delivery: &str, spend: Spend) -> Self {
        let delivery = delivery.to_owned();
        Self {
            delivery,
            spend,
            ..self
        }
    }

    /// The stores as a task handed over to the renderer because of `reason` (if it was)
    /// writes to them: a rendered result's terminal write says why.
    pub fn handed_over(self, reason: Option<&str>) -> Self {
        Self {
            render_reason: reason.map(ShellRule::new),
            ..self
        }
    }

    /// The stores as a job checks its pages for block pages: an object stored by another
    /// delivery is adopted only if it is not one.
    pub fn checking(self, detection: Detection) -> Self {
        Self { detection, ..self }
    }

    /// Whether a terminal write of this delivery counted its spend.
    pub fn spend_counted(&self) -> bool {
        self.spend_counted.load(Ordering::Relaxed)
    }
}

impl<T: TaskStore, R: ResultStore> Stores<'_, T, R> {
    /// Stores the page and finishes the task as successful, describing the object that is
    /// stored. The first stored object wins, and a later writer adopts it. A page that S3
    /// refuses as invalid fails the task, instead of coming back forever. `shell` is the
    /// application shell rule the page met, kept on the object and the task.
    #[tracing::instrument(skip_all, fields(%key))]
    pub async fn succeed(
        &self,
        task: &TaskRef,
        key: &ResultKey,
        page: &Page,
        shell: Option<ShellRule>,
    ) -> Result<Converged, StoreError> {
        let sha256 = hex::encode(Sha256::digest(&page.body));
        let stored = self
            .patience
            .retry(|| self.store_or_adopt(key, page, &sha256, shell.as_ref()))
            .await;
        let (stored, adopted) = match stored {
            Ok(stored) => stored,
            Err(err) if err.is_invalid() => {
                tracing::error!(error = %err, "S3 refused the result as invalid");
                let failure = Failure {
                    reason: Reason::new(&format!("the result could not be stored: {err}")),
                    http_status: Some(page.http_status),
                };
                return self.finish(task, Terminal::Failed(failure)).await;
            }
            Err(err) => return Err(err),
        };
        self.finish(task, Terminal::Succeeded(stored))
            .await
            .map(|converged| match converged {
                Converged::Succeeded { .. } => Converged::Succeeded { adopted },
                other => other,
            })
    }

    /// Carries a refresh task's earlier result forward on a `304 Not Modified`. The result
    /// is copied to the task's key, and the task is finished as successful with it. As for a
    /// page, the first object stored there wins and a later writer adopts it, unless it is a
    /// block page: then the copy replaces it. If the earlier object changed since it was
    /// checked, nothing is copied and this is a conflict, as for any object changed between
    /// two requests. The record then comes back, finds it changed, and fetches in full. On
    /// its final attempt it is sent again for that, as for any error on our side.
    #[tracing::instrument(skip_all, fields(%key))]
    pub async fn carry_forward(
        &self,
        task: &TaskRef,
        key: &ResultKey,
        earlier: &Earlier,
        page: &Page,
    ) -> Result<Converged, StoreError> {
        let validators = confirmed(&earlier.stored.validators, &page.validators);
        let carried = Carried {
            key,
            earlier,
            url: &page.url,
            validators: &validators,
            fetched_at: SystemTime::now(),
        };
        let copied = self.patience.retry(|| self.carry_or_adopt(carried));
        let Some((stored, adopted)) = copied.await? else {
            return Err(StoreError::Changed {
                detail: format!("{} changed as it was copied", earlier.stored.key),
            });
        };
        let converged = self.finish(task, Terminal::Succeeded(stored)).await?;
        Ok(match converged {
            Converged::Succeeded { .. } => Converged::Succeeded { adopted },
            other => other,
        })
    }

    /// Finishes the task as failed, unless an earlier delivery already stored its page. A
    /// stored result always wins over a failure, but a stored block page does not.
    #[tracing::instrument(skip_all, fields(%key))]
    pub async fn fail(
        &self,
        task: &TaskRef,
        key: &ResultKey,
        failure: Failure,
    ) -> Result<Converged, StoreError> {
        match self.adopt_stored(task, key).await? {
            Some(adopted) => Ok(adopted),
            None => self.finish(task, Terminal::Failed(failure)).await,
        }
    }

    /// Finishes the task as successful with the object an earlier delivery stored, if there
    /// is one: a redelivery after a crash or a persisting conflict need not fetch again.
    pub async fn adopt_stored(
        &self,
        task: &TaskRef,
        key: &ResultKey,
    ) -> Result<Option<Converged>, StoreError> {
        let Some(stored) = self.results.describe(key).await? else {
            return Ok(None);
        };
        // Boxed: the adopt paths are rare, and reading inline would make every delivery's
        // future larger.
        if Box::pin(self.stored_block(key, &stored)).await?.is_some() {
            return Ok(None);
        }
        let converged = self.finish(task, Terminal::Succeeded(stored)).await?;
        Ok(Some(match converged {
            Converged::Succeeded { .. } => Converged::Succeeded { adopted: true },
            other => other,
        }))
    }

    /// Stores the page, or describes the object already stored: (object, adopted).
    async fn store_or_adopt(
        &self,
        key: &ResultKey,
        page: &Page,
        sha256: &str,
        shell: Option<&ShellRule>,
    ) -> Result<(StoredResult, bool), StoreError> {
        let new = NewResult {
            key,
            page,
            sha256,
            fetched_at: SystemTime::now(),
            shell,
        };
        match self.results.put_if_absent(new).await? {
            Put::Stored => Ok((described(key, page, sha256, shell.cloned()), false)),
            // Gone between the put and the read (deleted meanwhile): a conflict, so the put
            // is tried again.
            Put::AlreadyThere => match self.results.describe(key).await? {
                Some(stored) => self.adopt_or_replace(new, stored).await,
                None => Err(StoreError::Changed {
                    detail: format!("{key} was there for the put but gone for the read"),
                }),
            },
        }
    }

    /// Copies the earlier result to the key, or describes the object already stored:
    /// (object, adopted). `None` when the earlier object changed since it was checked: no
    /// retry can copy it then.
    async fn carry_or_adopt(
        &self,
        carried: Carried<'_>,
    ) -> Result<Option<(StoredResult, bool)>, StoreError> {
        let key = carried.key;
        match self.results.carry_if_absent(carried).await? {
            Copied::Stored => Ok(Some((carried_result(carried), false))),
            // Gone between the copy and the read (deleted meanwhile): a conflict, so the copy
            // is tried again.
            Copied::AlreadyThere => match self.results.describe(key).await? {
                Some(stored) => self.adopt_or_carry_over(carried, stored).await,
                None => Err(StoreError::Changed {
                    detail: format!("{key} was there for the copy but gone for the read"),
                }),
            },
            Copied::EarlierChanged => Ok(None),
        }
    }

    /// Adopts the stored object, or replaces it with the earlier result if it is a block
    /// page. As in `adopt_or_replace`, the replacing copy is conditional on the block page's
    /// version: if another delivery stored an object meanwhile, that is a conflict, and the
    /// copy is tried again (and adopts that object). One object is stored, and the one
    /// terminal write describes it.
    async fn adopt_or_carry_over(
        &self,
        carried: Carried<'_>,
        stored: StoredResult,
    ) -> Result<Option<(StoredResult, bool)>, StoreError> {
        let Some(etag) = Box::pin(self.stored_block(carried.key, &stored)).await? else {
            return Ok(Some((stored, true)));
        };
        match self.results.carry_replacing(carried, &etag).await? {
            Copied::Stored => Ok(Some((carried_result(carried), false))),
            Copied::AlreadyThere => Err(StoreError::Changed {
                detail: format!("{} changed as its block page was replaced", carried.key),
            }),
            Copied::EarlierChanged => Ok(None),
        }
    }

    /// Adopts the stored object, or replaces it with the page if it is a block page. The
    /// replace is conditional on the object's version: if it changed meanwhile, that is a
    /// conflict, and the put is tried again.
    async fn adopt_or_replace(
        &self,
        new: NewResult<'_>,
        stored: StoredResult,
    ) -> Result<(StoredResult, bool), StoreError> {
        let Some(etag) = Box::pin(self.stored_block(new.key, &stored)).await? else {
            return Ok((stored, true));
        };
        match self.results.replace(new, &etag).await? {
            Put::Stored => Ok((
                described(new.key, new.page, new.sha256, new.shell.cloned()),
                false,
            )),
            Put::AlreadyThere => Err(StoreError::Changed {
                detail: format!("{} changed as its block page was replaced", new.key),
            }),
        }
    }

    /// The version of the object under `key` if it is a block page (stored by an earlier
    /// release, or before the detection table knew its signature). A block page is never a
    /// result.
    async fn stored_block(
        &self,
        key: &ResultKey,
        stored: &StoredResult,
    ) -> Result<Option<String>, StoreError> {
        blocked::stored_block(self.results, &self.detection, key, stored).await
    }

    /// The terminal write, retried on conflicts. If DynamoDB refuses the record as invalid
    /// (for example, the producer's item is near its 400 KB limit), it is written again with
    /// only what describes the end state.
    async fn finish(&self, task: &TaskRef, terminal: Terminal) -> Result<Converged, StoreError> {
        let terminal = match terminal {
            Terminal::Succeeded(stored) if stored.rendered.is_some() => {
                let render_reason = self.render_reason.clone();
                Terminal::Succeeded(StoredResult {
                    render_reason,
                    ..stored
                })
            }
            other => other,
        };
        let written = self.finish_once(task, &terminal).await;
        let (written, terminal) = match written {
            Err(err) if err.is_invalid() => {
                tracing::error!(error = %err, "the terminal record was refused as invalid; writing a minimal one");
                let minimal = minimal(&terminal, &err);
                (self.finish_once(task, &minimal).await, minimal)
            }
            written => (written, terminal),
        };
        Ok(match written? {
            Finish::Written { spend_counted, .. } => {
                self.spend_counted.store(spend_counted, Ordering::Relaxed);
                match terminal {
                    Terminal::Succeeded(_) => Converged::Succeeded { adopted: false },
                    Terminal::Failed(f) => Converged::Failed {
                        reason: f.reason.to_string(),
                    },
                }
            }
            Finish::LostRace => Converged::LostRace,
        })
    }

    async fn finish_once(&self, task: &TaskRef, terminal: &Terminal) -> Result<Finish, StoreError> {
        let finish = || {
            let spend = DeliverySpend {
                spend: &self.spend,
                delivery: &self.delivery,
            };
            let counted = CountedIn {
                counting: self.counting,
                spend,
            };
            self.tasks
                .finish(task, terminal, counted, SystemTime::now())
        };
        self.patience
            .retry_throttled(finish, FINISH_THROTTLED)
            .await
    }
}

/// The smallest record of an end state: the object's identity, or why it failed.
fn minimal(terminal: &Terminal, refused: &StoreError) -> Terminal {
    match terminal {
        Terminal::Succeeded(stored) => Terminal::Succeeded(stored.minimal()),
        Terminal::Failed(failure) => Terminal::Failed(Failure {
            reason: Reason::new(&format!("the failure record was refused: {refused}")),
            http_status: failure.http_status,
        }),
    }
}

/// The earlier result as carried forward to the task's key.
fn carried_result(carried: Carried<'_>) -> StoredResult {
    StoredResult {
        key: carried.key.clone(),
        validators: carried.validators.clone(),
        not_modified: true,
        ..carried.earlier.stored.clone()
    }
}

fn described(key: &ResultKey, page: &Page, sha256: &str, shell: Option<ShellRule>) -> StoredResult {
    StoredResult {
        key: key.clone(),
        sha256: sha256.to_owned(),
        size: page.body.len() as u64,
        http_status: page.http_status,
        content_type: page.content_type.clone(),
        final_url: page.final_url.clone(),
        validators: page.validators.clone(),
        not_modified: false,
        shell,
        rendered: page.rendered,
        render_reason: None,
    }
}

/// The validators a carried-forward result keeps: those the 304 sent (RFC 9111 4.3.4
/// updates the stored response with them), the earlier ones where it sent none.
fn confirmed(earlier: &Validators, answered: &Validators) -> Validators {
    Validators {
        etag: answered.etag.clone().or_else(|| earlier.etag.clone()),
        last_modified: (answered.last_modified.clone()).or_else(|| earlier.last_modified.clone()),
    }
}
