//! The templates that need no model: Q/A blocks, preference CSV, code splitting, JSONL renaming.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::output::Row;
use super::templates::Inputs;
use crate::LabError;
use crate::rng::{SplitMix, in_range};

/// `sft_qa_pairs`: `Q:`/`A:` blocks (either may run over several lines) → user/assistant chats.
pub fn qa_pairs(inputs: &Inputs) -> Vec<Row> {
    parse_qa(inputs.text("pairs_text"))
        .into_iter()
        .map(|(q, a)| Row::chat(&q, &a))
        .collect()
}

/// The complete `(question, answer)` pairs of `Q:`/`A:` text (markers case-insensitive).
pub fn parse_qa(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let (mut q, mut a): (Option<String>, Option<String>) = (None, None);
    let mut flush = |q: &mut Option<String>, a: &mut Option<String>| {
        if let (Some(qq), Some(aa)) = (q.take(), a.take())
            && !qq.trim().is_empty()
            && !aa.trim().is_empty()
        {
            pairs.push((qq.trim().to_string(), aa.trim().to_string()));
        }
    };
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(rest) = strip_marker(t, "q") {
            flush(&mut q, &mut a);
            q = Some(rest.to_string());
        } else if let Some(rest) = strip_marker(t, "a").filter(|_| q.is_some()) {
            a = Some(rest.to_string());
        } else if let Some(part) = a.as_mut().or(q.as_mut()) {
            part.push('\n');
            part.push_str(line);
        }
    }
    flush(&mut q, &mut a);
    pairs
}

/// `rest` of `"Q: rest"` for marker `q` (either case).
fn strip_marker<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let head = line.get(..2)?;
    (head.eq_ignore_ascii_case(&format!("{marker}:"))).then(|| line[2..].trim_start())
}

/// `dpo_pref_pairs`: CSV with a `prompt,chosen,rejected` header (any order, other columns
/// ignored); rows missing any of the three are skipped.
pub fn pref_pairs(inputs: &Inputs) -> Result<Vec<Row>, LabError> {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(inputs.text("csv_text").as_bytes());
    let bad = |e: csv::Error| LabError::config("inputs.csv_text", format!("not valid CSV: {e}"));
    let header = reader.headers().map_err(bad)?.clone();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h.trim().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                LabError::config(
                    "inputs.csv_text",
                    format!("the header needs a {name:?} column (prompt,chosen,rejected)"),
                )
            })
    };
    let (p, c, r) = (col("prompt")?, col("chosen")?, col("rejected")?);
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(bad)?;
        let get = |i: usize| record.get(i).map(str::trim).unwrap_or("");
        if [get(p), get(c), get(r)].iter().all(|s| !s.is_empty()) {
            rows.push(Row::dpo(get(p), get(c), get(r)));
        }
    }
    Ok(rows)
}

/// Largest source file read (bigger ones are skipped: generated or vendored code).
const MAX_SOURCE_BYTES: u64 = 4 << 20;

/// Smallest chunk kept (spec §9).
const MIN_CHUNK_CHARS: usize = 30;

/// `code_completion`: every `**/*.py` under `src_dir` (sorted), cut where a line starts with
/// `def `, `class ` or `async def `; each chunk of 30+ characters splits at a seeded point in
/// its middle half into prompt and completion; at most `max_pairs`.
pub fn code_pairs(inputs: &Inputs) -> Result<Vec<Row>, LabError> {
    let dir = crate::expand_home(inputs.text("src_dir"));
    if !dir.is_dir() {
        return Err(LabError::config(
            "inputs.src_dir",
            format!("{} is not a folder", dir.display()),
        ));
    }
    let max = inputs.number("max_pairs") as usize;
    let mut rng = SplitMix::new(inputs.number("seed"));
    let mut rows = Vec::new();
    for file in python_files(&dir)? {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue; // not UTF-8: not source we can split
        };
        for chunk in code_chunks(&text) {
            if rows.len() >= max {
                return Ok(rows);
            }
            let chars: Vec<(usize, char)> = chunk.char_indices().collect();
            let n = chars.len();
            let at = chars[in_range(&mut rng, n / 4, 3 * n / 4).min(n - 1)].0;
            rows.push(Row::prompt_completion(&chunk[..at], &chunk[at..]));
        }
    }
    Ok(rows)
}

/// The chunks of `text` that start at a top-level definition (plus the module head), at
/// least [`MIN_CHUNK_CHARS`] characters long.
fn code_chunks(text: &str) -> Vec<&str> {
    let mut starts = vec![0];
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let top = ["def ", "class ", "async def "]
            .iter()
            .any(|k| line.starts_with(k));
        if top && offset > 0 {
            starts.push(offset);
        }
        offset += line.len();
    }
    starts.push(text.len());
    starts
        .windows(2)
        .map(|w| &text[w[0]..w[1]])
        .filter(|c| c.trim().chars().count() >= MIN_CHUNK_CHARS)
        .collect()
}

/// `**/*.py` under `dir`, sorted by path; symbolic links are not followed (no cycles).
fn python_files(dir: &Path) -> Result<Vec<PathBuf>, LabError> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| LabError::io(&d, e))?;
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file()
                && path.extension().is_some_and(|e| e == "py")
                && entry.metadata().is_ok_and(|m| m.len() <= MAX_SOURCE_BYTES)
            {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `format_conversion`: each JSONL record's `user_key` and `assistant_key` strings → a chat.
/// Records lacking either are skipped; a line that is not a JSON object is an error naming it.
pub fn convert_jsonl(inputs: &Inputs) -> Result<Vec<Row>, LabError> {
    let (user, assistant) = (inputs.text("user_key"), inputs.text("assistant_key"));
    let mut rows = Vec::new();
    for (i, line) in inputs.text("input_jsonl").lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record: Value = serde_json::from_str(line)
            .map_err(|e| LabError::config("inputs.input_jsonl", format!("line {}: {e}", i + 1)))?;
        if !record.is_object() {
            let msg = format!("line {}: not a JSON object", i + 1);
            return Err(LabError::config("inputs.input_jsonl", msg));
        }
        let field = |k: &str| record.get(k).and_then(Value::as_str).map(str::trim);
        if let (Some(u), Some(a)) = (field(user), field(assistant))
            && !u.is_empty()
            && !a.is_empty()
        {
            rows.push(Row::chat(u, a));
        }
    }
    Ok(rows)
}
