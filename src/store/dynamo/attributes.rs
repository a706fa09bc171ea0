//! DynamoDB attribute values to and from plain Rust. This is the one place where items are
//! taken apart and put together. The adapter, the operator's routines and the tests all read
//! items through it.

use std::collections::HashMap;
use std::str::FromStr;

use aws_sdk_dynamodb::types::AttributeValue;

/// A DynamoDB item: attribute name to value.
pub type Item = HashMap<String, AttributeValue>;

/// A string attribute.
pub fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

/// A number attribute.
pub fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// The string attribute `name`, if the item has one.
pub fn string<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)?.as_s().ok().map(String::as_str)
}

/// The number attribute `name`, if the item has one that parses as `T`.
pub fn number<T: FromStr>(item: &Item, name: &str) -> Option<T> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

/// A string or number attribute as text (for people to read).
pub fn text(value: &AttributeValue) -> Option<String> {
    match value {
        AttributeValue::S(s) | AttributeValue::N(s) => Some(s.clone()),
        _ => None,
    }
}

/// An item of string attributes.
pub fn strings(fields: &[(&str, &str)]) -> Item {
    fields.iter().map(|(k, v)| (k.to_string(), s(v))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_read_back_as_written_and_wrong_types_read_as_absent() {
        let mut item = strings(&[("status", "pending")]);
        item.insert("attempts".into(), n(3));

        assert_eq!(string(&item, "status"), Some("pending"));
        assert_eq!(number::<u32>(&item, "attempts"), Some(3));
        assert_eq!(string(&item, "attempts"), None);
        assert_eq!(number::<u32>(&item, "status"), None);
        assert_eq!(text(&item["attempts"]).as_deref(), Some("3"));
    }
}
