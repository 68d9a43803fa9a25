//! Reading a JSONL data file: one JSON object a line, the format detected from its keys, every
//! row checked before anything is tokenized.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::LabError;

/// Data files over this size are refused: every example is held in memory while training.
pub(crate) const MAX_FILE_BYTES: u64 = 1 << 30;

/// The roles a `messages` turn may have.
const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// The row formats of spec §8.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataFormat {
    /// `{"messages": [{role, content}, …]}`: the loss is on the final (assistant) turn.
    Messages,
    /// `{"prompt", "completion"}`: the loss is on the completion.
    PromptCompletion,
    /// `{"text"}`: the loss is on the whole sequence.
    Text,
    /// `{"prompt", "chosen", "rejected"}`: preference pairs for DPO/ORPO.
    Preference,
}

impl DataFormat {
    /// The format's name as the API spells it (`"prompt_completion"`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            DataFormat::Messages => "messages",
            DataFormat::PromptCompletion => "prompt_completion",
            DataFormat::Text => "text",
            DataFormat::Preference => "preference",
        }
    }
}

impl fmt::Display for DataFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The format a row's keys say it has, or `None` for a non-object or unknown keys. A row with
/// `chosen` and `rejected` beside `prompt` is a preference pair even if it also has `completion`.
pub fn detect_format(row: &Value) -> Option<DataFormat> {
    let obj = row.as_object()?;
    let has = |key: &str| obj.contains_key(key);
    if has("messages") {
        Some(DataFormat::Messages)
    } else if has("prompt") && has("chosen") && has("rejected") {
        Some(DataFormat::Preference)
    } else if has("prompt") && has("completion") {
        Some(DataFormat::PromptCompletion)
    } else if has("text") {
        Some(DataFormat::Text)
    } else {
        None
    }
}

/// One checked row, its fields taken out of the JSON.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Row {
    /// The turns as given (objects with a known string `role` and a string `content`; the last
    /// is the assistant's).
    Messages(Vec<Value>),
    /// A prompt and the completion to learn.
    PromptCompletion { prompt: String, completion: String },
    /// A whole sequence to learn.
    Text(String),
    /// One prompt with a preferred and a dispreferred answer.
    Preference {
        prompt: String,
        chosen: String,
        rejected: String,
    },
}

/// Checks one row of a known format and takes its fields; the error says what is wrong with it.
pub(crate) fn parse_row(row: Value, format: DataFormat) -> Result<Row, String> {
    let Value::Object(mut obj) = row else {
        return Err("a row must be a JSON object".into());
    };
    if obj.contains_key("image") || obj.contains_key("images") {
        return Err("rows with `image`/`images` (vision) are not supported".into());
    }
    Ok(match format {
        DataFormat::Messages => Row::Messages(messages(&mut obj)?),
        DataFormat::PromptCompletion => Row::PromptCompletion {
            prompt: take_string(&mut obj, "prompt")?,
            completion: take_string(&mut obj, "completion")?,
        },
        DataFormat::Text => Row::Text(take_string(&mut obj, "text")?),
        DataFormat::Preference => Row::Preference {
            prompt: take_string(&mut obj, "prompt")?,
            chosen: take_string(&mut obj, "chosen")?,
            rejected: take_string(&mut obj, "rejected")?,
        },
    })
}

/// The `messages` field: a non-empty list of well-formed turns ending with the assistant's,
/// since that final turn is what the loss is on.
fn messages(obj: &mut Map<String, Value>) -> Result<Vec<Value>, String> {
    let turns = match obj.remove("messages") {
        Some(Value::Array(turns)) => turns,
        Some(other) => return Err(format!("`messages` must be an array, not {}", kind(&other))),
        None => return Err("`messages` is missing".into()),
    };
    let Some(last) = turns.last() else {
        return Err("`messages` is empty".into());
    };
    for (i, turn) in turns.iter().enumerate() {
        check_turn(turn).map_err(|why| format!("messages[{i}]: {why}"))?;
    }
    if last.get("role").and_then(Value::as_str) != Some("assistant") {
        return Err(format!(
            "messages[{}]: the final turn must be the assistant's (the loss is on it)",
            turns.len() - 1
        ));
    }
    Ok(turns)
}

/// One turn: an object with a known string `role` and a string `content`.
fn check_turn(turn: &Value) -> Result<(), String> {
    let Some(obj) = turn.as_object() else {
        return Err(format!("a turn must be an object, not {}", kind(turn)));
    };
    match obj.get("role") {
        Some(Value::String(role)) if ROLES.contains(&role.as_str()) => {}
        Some(Value::String(role)) => {
            return Err(format!(
                "unknown role {:?} (expected one of {})",
                clip(role),
                ROLES.join(", ")
            ));
        }
        Some(other) => return Err(format!("`role` must be a string, not {}", kind(other))),
        None => return Err("`role` is missing".into()),
    }
    match obj.get("content") {
        Some(Value::String(_)) => Ok(()),
        Some(other) => Err(format!("`content` must be a string, not {}", kind(other))),
        None => Err("`content` is missing".into()),
    }
}

/// Takes the string field `key` out of a row.
fn take_string(obj: &mut Map<String, Value>, key: &str) -> Result<String, String> {
    match obj.remove(key) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("`{key}` must be a string, not {}", kind(&other))),
        None => Err(format!("`{key}` is missing")),
    }
}

/// The JSON type of a value, for error messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// At most 40 characters of a user's string, so a hostile key cannot flood an error message.
fn clip(s: &str) -> String {
    const MAX: usize = 40;
    match s.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}…", s.get(..end).unwrap_or_default()),
        None => s.to_string(),
    }
}

/// Why a row's keys match no format, naming the first few keys it has.
fn unknown_format(row: &Value) -> String {
    let Some(obj) = row.as_object() else {
        return format!("a row must be a JSON object, not {}", kind(row));
    };
    let keys: Vec<String> = obj
        .keys()
        .take(8)
        .map(|k| format!("{:?}", clip(k)))
        .collect();
    let more = if obj.len() > keys.len() { ", …" } else { "" };
    format!(
        "unknown row format (keys: [{}{more}]); expected `messages`, `prompt`+`completion`, \
         `text` or `prompt`+`chosen`+`rejected`",
        keys.join(", ")
    )
}

/// Reads `path` line by line, calling `each(line, row)` for every non-blank line once it has
/// been checked, and returns the file's format. Lines are numbered from 1, blank ones included.
/// All rows must share the first row's format; a file without rows is an error.
pub(crate) fn read_rows(
    path: &Path,
    mut each: impl FnMut(usize, Row) -> Result<(), LabError>,
) -> Result<DataFormat, LabError> {
    let file = File::open(path).map_err(|e| LabError::io(path, e))?;
    let size = file.metadata().map_err(|e| LabError::io(path, e))?.len();
    if size > MAX_FILE_BYTES {
        return Err(too_large(path));
    }
    // The length can lie (a growing file, a device); the reader stops one byte past the limit.
    let mut reader = BufReader::new(file.take(MAX_FILE_BYTES + 1));
    let mut buf = Vec::new();
    let (mut line, mut total) = (0usize, 0u64);
    let mut first: Option<(DataFormat, usize)> = None;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| LabError::io(path, e))?;
        if n == 0 {
            break;
        }
        total = total.saturating_add(n as u64);
        if total > MAX_FILE_BYTES {
            return Err(too_large(path));
        }
        line += 1;
        let Some(value) = line_value(&buf).map_err(|why| LabError::data(path, line, why))? else {
            continue;
        };
        let format = row_format(&value, first).map_err(|why| LabError::data(path, line, why))?;
        first.get_or_insert((format, line));
        let row = parse_row(value, format).map_err(|why| LabError::data(path, line, why))?;
        each(line, row)?;
    }
    first
        .map(|(format, _)| format)
        .ok_or_else(|| LabError::data(path, 0, "the file has no rows"))
}

/// The JSON of one line, or `None` for a blank line.
fn line_value(bytes: &[u8]) -> Result<Option<Value>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| format!("invalid JSON: {e}"))
}

/// The row's format, which must be the first row's when there was one.
fn row_format(value: &Value, first: Option<(DataFormat, usize)>) -> Result<DataFormat, String> {
    let format = detect_format(value).ok_or_else(|| unknown_format(value))?;
    match first {
        Some((expected, at)) if expected != format => Err(format!(
            "this row is `{format}` but line {at} is `{expected}`: all rows of a file must have \
             one format"
        )),
        _ => Ok(format),
    }
}

/// The error for a file over [`MAX_FILE_BYTES`].
fn too_large(path: &Path) -> LabError {
    LabError::data(
        path,
        0,
        "the file is larger than 1 GiB, the limit for data files",
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn detects_each_format_from_its_keys() {
        let cases = [
            (json!({"messages": []}), Some(DataFormat::Messages)),
            (
                json!({"prompt": "p", "completion": "c"}),
                Some(DataFormat::PromptCompletion),
            ),
            (json!({"text": "t"}), Some(DataFormat::Text)),
            (
                json!({"prompt": "p", "chosen": "a", "rejected": "b"}),
                Some(DataFormat::Preference),
            ),
            // A pair that also carries a completion is still a pair.
            (
                json!({"prompt": "p", "completion": "c", "chosen": "a", "rejected": "b"}),
                Some(DataFormat::Preference),
            ),
            (json!({"prompt": "p", "chosen": "a"}), None),
            (json!({"prompt": "p"}), None),
            (json!({"other": 1}), None),
            (json!(["text"]), None),
            (json!("text"), None),
        ];
        for (row, want) in cases {
            assert_eq!(detect_format(&row), want, "{row}");
        }
    }

    #[test]
    fn formats_serialize_snake_case() {
        let names = serde_json::to_value([
            DataFormat::Messages,
            DataFormat::PromptCompletion,
            DataFormat::Text,
            DataFormat::Preference,
        ])
        .unwrap();
        assert_eq!(
            names,
            json!(["messages", "prompt_completion", "text", "preference"])
        );
    }

    fn parse(row: Value) -> Result<Row, String> {
        let format = detect_format(&row).ok_or("undetected")?;
        parse_row(row, format)
    }

    #[test]
    fn rejects_malformed_fields() {
        let bad = [
            (json!({"text": 3}), "`text` must be a string"),
            (
                json!({"prompt": "p", "completion": null}),
                "`completion` must be",
            ),
            (json!({"messages": "hi"}), "must be an array"),
            (json!({"messages": []}), "empty"),
            (
                json!({"messages": [1]}),
                "messages[0]: a turn must be an object",
            ),
            (
                json!({"messages": [{"role": "user"}]}),
                "`content` is missing",
            ),
            (
                json!({"messages": [{"role": "bot", "content": "x"}]}),
                "unknown role",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]}),
                "messages[1]: the final turn must be the assistant's",
            ),
            (json!({"text": "t", "images": []}), "vision"),
        ];
        for (row, want) in bad {
            let err = parse(row.clone()).unwrap_err();
            assert!(err.contains(want), "{row}: {err}");
        }
    }

    #[test]
    fn takes_the_fields_of_good_rows() {
        let turns =
            json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]);
        assert_eq!(
            parse(json!({"messages": turns.clone()})),
            Ok(Row::Messages(turns.as_array().unwrap().clone()))
        );
        assert_eq!(
            parse(json!({"prompt": "p", "chosen": "c", "rejected": "r"})),
            Ok(Row::Preference {
                prompt: "p".into(),
                chosen: "c".into(),
                rejected: "r".into()
            })
        );
    }

    #[test]
    fn clips_long_user_strings() {
        let long = "k".repeat(1000);
        let msg = unknown_format(&json!({ long.clone(): 1 }));
        assert!(msg.len() < 300, "{msg}");
        assert_eq!(clip("short"), "short");
        assert_eq!(clip(&"é".repeat(50)).chars().count(), 41);
    }
}
