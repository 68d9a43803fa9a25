//! Rows and the split (spec §9): `train.jsonl` holds the first `max(1, ⌊0.9n⌋)` rows,
//! `valid.jsonl` the rest (the last row when that would be empty), one object a line.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::LabError;

/// One generated record; `extra` keys (such as `verified`) ride beside the format's own.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub Value);

impl Row {
    /// A user → assistant chat.
    pub fn chat(user: &str, assistant: &str) -> Self {
        Row::messages(vec![message("user", user), message("assistant", assistant)])
    }

    /// `{messages}`.
    pub fn messages(messages: Vec<Value>) -> Self {
        Row(json!({ "messages": messages }))
    }

    /// `{prompt, completion}`.
    pub fn prompt_completion(prompt: &str, completion: &str) -> Self {
        Row(json!({ "prompt": prompt, "completion": completion }))
    }

    /// `{prompt, chosen, rejected}`.
    pub fn dpo(prompt: &str, chosen: &str, rejected: &str) -> Self {
        Row(json!({ "prompt": prompt, "chosen": chosen, "rejected": rejected }))
    }

    /// `{text}`.
    pub fn text(text: &str) -> Self {
        Row(json!({ "text": text }))
    }

    /// Adds `key: value` beside the row's own keys.
    pub fn with(mut self, key: &str, value: Value) -> Self {
        if let Some(o) = self.0.as_object_mut() {
            o.insert(key.into(), value);
        }
        self
    }
}

/// `{role, content}`.
pub fn message(role: &str, content: &str) -> Value {
    json!({ "role": role, "content": content })
}

/// Where a dataset went and how it was split.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Written {
    /// The folder.
    pub output_dir: PathBuf,
    /// Rows generated.
    pub rows: usize,
    /// Rows in `train.jsonl`.
    pub n_train: usize,
    /// Rows in `valid.jsonl`.
    pub n_valid: usize,
}

/// The spec's split point: `max(1, ⌊0.9n⌋)`.
pub fn split_index(n: usize) -> usize {
    (n * 9 / 10).max(1)
}

/// Writes `rows` into `dir` (created if missing) as `train.jsonl` and `valid.jsonl`. Each file
/// is written beside its final name and renamed, so a reader never sees half a file.
pub fn write_split(dir: &Path, rows: &[Row]) -> Result<Written, LabError> {
    if rows.is_empty() {
        return Err(LabError::Generate(
            "generator produced 0 rows — check your inputs".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| LabError::io(dir, e))?;
    let split = split_index(rows.len());
    let train = &rows[..split];
    let valid = match &rows[split..] {
        [] => &rows[rows.len() - 1..],
        rest => rest,
    };
    write_jsonl(&dir.join("train.jsonl"), train)?;
    write_jsonl(&dir.join("valid.jsonl"), valid)?;
    Ok(Written {
        output_dir: dir.to_path_buf(),
        rows: rows.len(),
        n_train: train.len(),
        n_valid: valid.len(),
    })
}

fn write_jsonl(path: &Path, rows: &[Row]) -> Result<(), LabError> {
    let partial = path.with_extension("jsonl.partial");
    let io = |e| LabError::io(&partial, e);
    let mut out = std::io::BufWriter::new(std::fs::File::create(&partial).map_err(io)?);
    for row in rows {
        serde_json::to_writer(&mut out, &row.0).map_err(|e| io(e.into()))?;
        out.write_all(b"\n").map_err(io)?;
    }
    out.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    std::fs::rename(&partial, path).map_err(|e| LabError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_is_ninety_ten_and_never_leaves_valid_empty() {
        assert_eq!(split_index(1), 1);
        assert_eq!(split_index(2), 1);
        assert_eq!(split_index(10), 9);
        assert_eq!(split_index(19), 17);
        let dir = tempfile::tempdir().unwrap();
        let one = write_split(dir.path(), &[Row::text("only")]).unwrap();
        assert_eq!((one.n_train, one.n_valid), (1, 1));
        let valid = std::fs::read_to_string(dir.path().join("valid.jsonl")).unwrap();
        assert_eq!(valid, "{\"text\":\"only\"}\n");
        let rows: Vec<Row> = (0..25).map(|i| Row::text(&i.to_string())).collect();
        let w = write_split(dir.path(), &rows).unwrap();
        assert_eq!((w.n_train, w.n_valid), (22, 3));
        let train = std::fs::read_to_string(dir.path().join("train.jsonl")).unwrap();
        assert_eq!(train.lines().count(), 22);
        assert!(train.ends_with("{\"text\":\"21\"}\n"));
    }

    #[test]
    fn zero_rows_is_the_specs_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_split(dir.path(), &[]).unwrap_err().to_string();
        assert_eq!(e, "generator produced 0 rows — check your inputs");
        assert!(!dir.path().join("train.jsonl").exists());
    }
}
