//! Items as earlier releases wrote them, kept as DynamoDB JSON files under `tests/fixtures/`
//! (`{"pk": {"S": "…"}, "body": {"B": "<base64>"}}`, as the AWS CLI prints them), read
//! back as items a test puts in its table.

use std::path::PathBuf;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_smithy_types::Blob;
use conveyor_worker::store::dynamo::attributes::Item;
use serde_json::Value;

/// The item in `tests/fixtures/<name>`; panics on a file that is not one (a test's mistake).
pub fn item(name: &str) -> Item {
    let path = fixtures_dir().join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let json: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match json {
        Value::Object(fields) => fields.iter().map(|(k, v)| (k.clone(), value(v))).collect(),
        _ => panic!("{}: not an item", path.display()),
    }
}

fn fixtures_dir() -> PathBuf {
    // The test kit sits one level below the workspace root.
    let testkit = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    testkit.parent().unwrap_or(&testkit).join("tests/fixtures")
}

/// One attribute value in DynamoDB JSON: an object of one type name and its value.
fn value(json: &Value) -> AttributeValue {
    let strings = |list: &Value| -> Vec<String> {
        let list = list.as_array().unwrap_or_else(|| panic!("a list: {list}"));
        list.iter().map(|s| text(s).to_owned()).collect()
    };
    let (kind, inner) = json
        .as_object()
        .filter(|typed| typed.len() == 1)
        .and_then(|typed| typed.iter().next())
        .unwrap_or_else(|| panic!("not a typed value: {json}"));
    match kind.as_str() {
        "S" => AttributeValue::S(text(inner).to_owned()),
        "N" => AttributeValue::N(text(inner).to_owned()),
        "B" => AttributeValue::B(binary(text(inner))),
        "BOOL" => AttributeValue::Bool(inner.as_bool().unwrap_or_else(|| panic!("{json}"))),
        "NULL" => AttributeValue::Null(true),
        "SS" => AttributeValue::Ss(strings(inner)),
        "NS" => AttributeValue::Ns(strings(inner)),
        "BS" => AttributeValue::Bs(strings(inner).iter().map(|b| binary(b)).collect()),
        "L" => AttributeValue::L(match inner {
            Value::Array(list) => list.iter().map(value).collect(),
            _ => panic!("not a list: {json}"),
        }),
        "M" => AttributeValue::M(match inner {
            Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), value(v))).collect(),
            _ => panic!("not a map: {json}"),
        }),
        _ => panic!("no DynamoDB type {kind}"),
    }
}

fn text(json: &Value) -> &str {
    json.as_str()
        .unwrap_or_else(|| panic!("not a string: {json}"))
}

fn binary(base64: &str) -> Blob {
    let bytes = aws_smithy_types::base64::decode(base64)
        .unwrap_or_else(|e| panic!("not base64 ({e}): {base64}"));
    Blob::new(bytes)
}
