//! Calibration text for sensitivity: a user's file (plain text, or JSONL records with `text` or
//! `messages`) or the built-in corpus, tokenized without special tokens into one stream and cut
//! into chunks whose starts are shuffled with a fixed seed (spec §7.2.2).

use std::path::Path;

use kiln_model::tokenizer::KilnTokenizer;
use serde_json::Value;

use crate::LabError;

/// The built-in corpus: varied prose, lists, code and dialogue, so that every kind of layer sees
/// typical activations without a download.
pub const BUILTIN: &str = include_str!("calibration.txt");

/// Reads the calibration file as one text: JSONL when every non-empty line is a JSON object with
/// `text` or `messages` (rendered `[role]: content`, joined by blank lines), else plain text.
pub fn read_text(path: &Path) -> Result<String, LabError> {
    let raw = std::fs::read_to_string(path).map_err(|e| LabError::io(path, e))?;
    let jsonl = path
        .extension()
        .is_some_and(|e| e == "jsonl" || e == "json");
    if !jsonl {
        return Ok(raw);
    }
    parse_jsonl(&raw)
}

/// The text of JSONL calibration records (the fuzz target's entry point): one JSON object a
/// line with `text` or `messages`; an error names the first bad line.
pub fn parse_jsonl(raw: &str) -> Result<String, LabError> {
    let mut pieces = Vec::new();
    for (i, line) in raw.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| LabError::config("calibration", format!("line {}: {why}", i + 1));
        let v: Value = serde_json::from_str(line).map_err(|e| bad(&e.to_string()))?;
        pieces.push(record_text(&v).ok_or_else(|| bad("needs `text` or `messages`"))?);
    }
    if pieces.is_empty() {
        return Err(LabError::config("calibration", "the file has no records"));
    }
    Ok(pieces.join("\n\n"))
}

fn record_text(v: &Value) -> Option<String> {
    if let Some(t) = v.get("text").and_then(Value::as_str) {
        return Some(t.to_string());
    }
    let msgs = v.get("messages")?.as_array()?;
    let turns: Option<Vec<String>> = msgs
        .iter()
        .map(|m| {
            let role = m.get("role")?.as_str()?;
            let content = m.get("content")?.as_str()?;
            Some(format!("[{role}]: {content}"))
        })
        .collect();
    Some(turns?.join("\n\n"))
}

/// Cuts `text` into `n` chunks of `seq_len` tokens: starts `0, seq, 2·seq, …` below
/// `len − seq`, shuffled with seed 42, the first `n` taken. Fewer chunks when the text is short.
pub fn chunks(
    tokenizer: &KilnTokenizer,
    text: &str,
    n: usize,
    seq_len: usize,
) -> Result<Vec<Vec<u32>>, LabError> {
    let ids = tokenizer.encode(text, false)?;
    if ids.len() <= seq_len {
        return Err(LabError::config(
            "calibration",
            format!(
                "the text has {} tokens; one chunk needs {seq_len}",
                ids.len()
            ),
        ));
    }
    // Python's `range(0, len - seq, seq)`, as mlx-bun and optiq write it (spec §7.2.2): a text
    // of exactly k whole chunks yields k - 1 of them.
    let mut starts: Vec<usize> = (0..ids.len() - seq_len).step_by(seq_len).collect();
    shuffle(&mut starts, 42);
    starts.truncate(n);
    Ok(starts
        .iter()
        .map(|&s| ids[s..s + seq_len].to_vec())
        .collect())
}

/// Fisher–Yates with splitmix64: deterministic across platforms and releases.
fn shuffle(v: &mut [usize], seed: u64) {
    let mut rng = crate::rng::SplitMix::new(seed);
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_is_a_fixed_permutation() {
        let mut a: Vec<usize> = (0..10).collect();
        shuffle(&mut a, 42);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        assert_ne!(
            a, sorted,
            "a shuffle of 10 that is the identity is a broken shuffle"
        );
        let mut b: Vec<usize> = (0..10).collect();
        shuffle(&mut b, 42);
        assert_eq!(a, b);
    }

    #[test]
    fn jsonl_records_render_text_and_messages_and_name_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.jsonl");
        let body = "{\"text\":\"plain\"}\n\n{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]}\n";
        std::fs::write(&p, body).unwrap();
        assert_eq!(
            read_text(&p).unwrap(),
            "plain\n\n[user]: hi\n\n[assistant]: yo"
        );
        std::fs::write(&p, "{\"text\":\"ok\"}\nnot json\n").unwrap();
        let err = read_text(&p).unwrap_err().to_string();
        assert!(err.starts_with("calibration: line 2"), "{err}");
        std::fs::write(&p, "{\"other\":1}\n").unwrap();
        assert!(
            read_text(&p)
                .unwrap_err()
                .to_string()
                .contains("`text` or `messages`")
        );
    }
}
