//! `serde_json` values as template values, keeping object keys in the order they arrive (Python
//! dicts keep insertion order, and `tojson` of a tool schema should print it the same way).

use std::collections::HashMap;
use std::sync::Arc;

use minijinja::Value;
use minijinja::value::{Enumerator, Object, ObjectRepr};

/// Converts a JSON value; objects become [`OrderedMap`]s.
pub(crate) fn from_json(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => Value::from(a.iter().map(from_json).collect::<Vec<_>>()),
        serde_json::Value::Object(m) => Value::from_object(OrderedMap::new(
            m.iter().map(|(k, v)| (k.clone(), from_json(v))).collect(),
        )),
    }
}

/// A string-keyed map that iterates in insertion order.
#[derive(Debug)]
pub(crate) struct OrderedMap {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl OrderedMap {
    fn new(entries: Vec<(String, Value)>) -> Self {
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        Self { entries, index }
    }
}

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let i = *self.index.get(key.as_str()?)?;
        self.entries.get(i).map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.entries
                .iter()
                .map(|(k, _)| Value::from(k.as_str()))
                .collect(),
        )
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.entries.len())
    }
}
