//! The run item's writes from the operator's routines: moving the count of tasks submitted
//! forward.

use crate::store::dynamo::attributes::{n, s};
use crate::store::dynamo::expressions::Expression;

/// A put that only creates: the condition is that nothing has this key yet.
pub(crate) const ABSENT: &str = "attribute_not_exists(pk)";

/// The producer's submit cursor moved on: tasks before `through` are written and sent.
pub(crate) fn advance_submitted(through: u64, now: &str) -> Expression {
    Expression::new(
        "SET submitted_through = :through, updated_at = :now".into(),
        "attribute_not_exists(submitted_through) OR submitted_through < :through",
    )
    .value(":through", n(through))
    .value(":now", s(now))
}
