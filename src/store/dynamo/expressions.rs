//! A DynamoDB write expression: an update, its condition, and exactly the names and values
//! they use. DynamoDB refuses unused ones. Each item type's writes are next to that type, in
//! its own `writes` module.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure, Update};

use crate::domain::model::Terminal;
use crate::store::dynamo::attributes::{Item, n};

/// An update with its condition, names and values.
pub(crate) struct Expression {
    pub(super) update: String,
    pub(super) condition: String,
    names: HashMap<String, String>,
    values: Item,
}

impl Expression {
    pub(crate) fn new(update: String, condition: &str) -> Self {
        Self {
            update,
            condition: condition.to_owned(),
            names: HashMap::new(),
            values: Item::new(),
        }
    }

    pub(crate) fn name(mut self, placeholder: &str, name: &str) -> Self {
        self.names.insert(placeholder.into(), name.into());
        self
    }

    pub(crate) fn value(mut self, placeholder: &str, value: AttributeValue) -> Self {
        self.values.insert(placeholder.into(), value);
        self
    }

    /// With `adds` in the update's `ADD` clause, which is added if there is none. Each entry
    /// is an attribute and the placeholder of its value (`:name`).
    pub(crate) fn with_adds(mut self, adds: &[(String, String)]) -> Self {
        if adds.is_empty() {
            return self;
        }
        let adds = adds
            .iter()
            .map(|(name, value)| format!("{name} {value}"))
            .collect::<Vec<_>>()
            .join(", ");
        self.update = match self.update.split_once("ADD ") {
            Some((before, after)) => format!("{before}ADD {adds}, {after}"),
            None => format!("{} ADD {adds}", self.update)
                .trim_start()
                .to_owned(),
        };
        self
    }

    /// As one item of a transaction.
    pub(crate) fn into_update(self, table: &str, key: Item) -> Update {
        Update::builder()
            .table_name(table)
            .set_key(Some(key))
            .update_expression(self.update)
            .set_condition_expression((!self.condition.is_empty()).then_some(self.condition))
            .set_expression_attribute_names(non_empty(self.names))
            .set_expression_attribute_values(non_empty(self.values))
            // Return the item as it was when the condition failed. A success needs it to tell
            // a failure it may replace from one it may not.
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("table, key and update expression, the required fields, are set")
    }

    /// As an `UpdateItem` request.
    pub(crate) fn apply_to(self, request: UpdateItemFluentBuilder) -> UpdateItemFluentBuilder {
        let condition = (!self.condition.is_empty()).then_some(self.condition);
        request
            .update_expression(self.update)
            .set_condition_expression(condition)
            .set_expression_attribute_names(non_empty(self.names))
            .set_expression_attribute_values(non_empty(self.values))
    }

    /// Counts a success carried forward on a `304 Not Modified` on the counter item (the run
    /// or a shard): one more page not modified, and its bytes as not fetched.
    pub(crate) fn with_not_modified(self, terminal: &Terminal) -> Self {
        let Terminal::Succeeded(stored) = terminal else {
            return self;
        };
        if !stored.not_modified {
            return self;
        }
        let adds = [
            ("pages_not_modified".to_owned(), ":nm_pages".to_owned()),
            ("bytes_not_fetched".to_owned(), ":nm_bytes".to_owned()),
        ];
        self.value(":nm_pages", n(1))
            .value(":nm_bytes", n(stored.size))
            .with_adds(&adds)
    }
}

/// DynamoDB refuses an empty map of expression names or values.
fn non_empty<V>(map: HashMap<String, V>) -> Option<HashMap<String, V>> {
    (!map.is_empty()).then_some(map)
}
