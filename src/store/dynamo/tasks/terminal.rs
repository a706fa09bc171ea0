//! The task's terminal write alone, without its run's count: for a run that keeps no
//! counters, and for the counted writes (`run_counters`, `shards`) when they fall back on it.

use crate::domain::ids::TaskRef;
use crate::domain::model::{TaskStatus, Terminal};
use crate::ports::error::StoreError;
use crate::ports::tasks::Finish;
use crate::store::dynamo::attributes::{Item, string};
use crate::store::dynamo::{DynamoTaskStore, is_condition_failure};

use super::writes::{self, Over};

/// The terminal write alone, for a task whose run keeps no counters.
pub(crate) async fn finish_uncounted(
    store: &DynamoTaskStore,
    task: &TaskRef,
    terminal: &Terminal,
    now: &str,
    over: Over,
) -> Result<Finish, StoreError> {
    let write = writes::task_terminal(terminal, now, over);
    let result = store.update_task(task, write).send().await;
    match result {
        Ok(_) => Ok(Finish::Written {
            completed_run: false,
            spend_counted: false,
        }),
        Err(err) if is_condition_failure(&err) => Ok(Finish::LostRace),
        Err(err) => Err(StoreError::from_sdk("UpdateItem(finish)", err)),
    }
}

/// A task item that is `failed` and names no stored result.
pub(crate) fn is_failure_without_result(item: &Item) -> bool {
    string(item, "status") == Some(TaskStatus::Failed.as_str()) && !item.contains_key("result_key")
}
