//! Fine-tune data (spec §8.2): JSONL files read, checked and tokenized into examples whose loss
//! positions are known, and the order they are trained in.
//!
//! **Files.** A data folder holds `train.jsonl` (required) and `valid.jsonl` (optional); a single
//! file may stand for the folder (then there is no validation set). One JSON object a line;
//! blank lines are skipped, lines are numbered from 1 counting them. The format is detected from
//! the first row's keys ([`detect_format`]) and every row must have the same one. Files are
//! hostile input: invalid UTF-8 or JSON, a non-object row, unknown keys, a field of the wrong
//! type, an empty file and a file over 1 GiB are errors ([`LabError::Data`]) naming the file and
//! the line (0 for the file as a whole). Rows with `image`/`images` (optiq's vision format) are
//! refused.
//!
//! **Tokenization** (the loss is on predicting `tokens[prompt_len..]`, never on the first token):
//! - `messages`: the final turn must be the assistant's. The prompt is
//!   `template.render(&messages[..n-1], add_generation_prompt = true)`, the sequence
//!   `template.render(&messages, false)`, both encoded with
//!   [`kiln_model::chat_template::prompt_ids`] (at most one BOS). `prompt_len` is the prompt's
//!   length, or where the two encodings first differ when the prompt is not a prefix of the
//!   sequence. A model without a chat template cannot use this format.
//! - `prompt_completion`: with a template, the two-turn chat `[user: prompt, assistant:
//!   completion]` as above. Without one, `encode(prompt)` (BOS when the model adds it), then
//!   `encode(completion)` without special tokens, then the primary EOS; `prompt_len` is the
//!   prompt's length.
//! - `text`: `encode(text)` with special tokens, then EOS; `prompt_len` 0.
//! - `preference`: `chosen` and `rejected` each built as `prompt_completion` with the shared
//!   prompt.
//!
//! EOS is appended only when the sequence does not already end with an end-of-generation token.
//!
//! **Truncation.** Every sequence keeps its first `max_seq_length` tokens ([`Dataset::truncated`]
//! counts the rows cut). A row left without a loss token (no position at or past
//! `max(prompt_len, 1)`, whether from the cut or from an empty answer) is dropped and counted in
//! [`Dataset::dropped`]; a pair is dropped when either side is. A file that keeps no example is an
//! error.
//!
//! **Order.** [`epoch_batches`] and [`padded_len`] implement §8.2's batching rules.

mod batches;
mod rows;
mod tokenize;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use batches::{epoch_batches, padded_len};
pub use rows::{DataFormat, detect_format};
pub use tokenize::{PreferenceExample, SftExample, Tokenize};

use crate::LabError;
use rows::read_rows;
use tokenize::Tokenized;

/// The examples of one file, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Examples {
    /// `messages`, `prompt_completion` or `text` rows.
    Sft(Vec<SftExample>),
    /// `preference` rows.
    Preference(Vec<PreferenceExample>),
}

impl Examples {
    /// How many examples there are.
    pub fn len(&self) -> usize {
        match self {
            Examples::Sft(v) => v.len(),
            Examples::Preference(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each example's length in tokens (a pair's longer side), for [`epoch_batches`].
    pub fn lengths(&self) -> Vec<usize> {
        match self {
            Examples::Sft(v) => v.iter().map(|e| e.tokens.len()).collect(),
            Examples::Preference(v) => v
                .iter()
                .map(|p| p.chosen.tokens.len().max(p.rejected.tokens.len()))
                .collect(),
        }
    }
}

/// One tokenized data file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    /// The rows' format.
    pub format: DataFormat,
    /// The usable examples, in file order.
    pub examples: Examples,
    /// Rows left with no loss token after truncation (not in `examples`).
    pub dropped: usize,
    /// Rows cut to `max_seq_length` (kept or dropped).
    pub truncated: usize,
}

/// Counts and format without tokenizing (for `POST /api/finetune/inspect-dataset`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DatasetSummary {
    /// Rows in the training file.
    pub n_train: usize,
    /// Rows in the validation file (0 without one).
    pub n_valid: usize,
    /// The rows' format.
    pub format: DataFormat,
}

/// Reads, checks and tokenizes one JSONL file (see the module doc for the rules).
pub fn load_jsonl(path: &Path, tk: &Tokenize) -> Result<Dataset, LabError> {
    if tk.max_seq_length < 2 {
        return Err(LabError::config(
            "max_seq_length",
            "must be at least 2 (a sequence needs a token to predict from and one to predict)",
        ));
    }
    let mut acc = Accumulator::default();
    let format = read_rows(path, |line, row| {
        let example = tk
            .row(&row)
            .map_err(|why| LabError::data(path, line, why))?;
        acc.add(example, tk.max_seq_length);
        Ok(())
    })?;
    acc.finish(path, format, tk.max_seq_length)
}

/// `data_dir` is a folder holding train.jsonl (required) and valid.jsonl (optional), or a single
/// .jsonl file (then no validation set). Both files must have the same format.
pub fn load_data_dir(
    data_dir: &Path,
    tk: &Tokenize,
) -> Result<(Dataset, Option<Dataset>), LabError> {
    let files = DataFiles::find(data_dir)?;
    let train = load_jsonl(&files.train, tk)?;
    let valid = match &files.valid {
        Some(path) => {
            let valid = load_jsonl(path, tk)?;
            same_format(path, valid.format, train.format)?;
            Some(valid)
        }
        None => None,
    };
    Ok((train, valid))
}

/// Counts the rows of a data folder (or file) and names their format, checking every row as
/// [`load_data_dir`] would but without a tokenizer.
pub fn inspect_data_dir(data_dir: &Path) -> Result<DatasetSummary, LabError> {
    let files = DataFiles::find(data_dir)?;
    let (n_train, format) = count_rows(&files.train)?;
    let n_valid = match &files.valid {
        Some(path) => {
            let (n, valid_format) = count_rows(path)?;
            same_format(path, valid_format, format)?;
            n
        }
        None => 0,
    };
    Ok(DatasetSummary {
        n_train,
        n_valid,
        format,
    })
}

/// [`inspect_data_dir`] plus the first `limit` rows of the training file, as written.
#[derive(Debug, Clone, Serialize)]
pub struct DatasetPreview {
    /// The counts and format.
    #[serde(flatten)]
    pub summary: DatasetSummary,
    /// The first rows of the training file.
    pub rows: Vec<serde_json::Value>,
}

/// Checks a data folder as [`inspect_data_dir`] does and returns its first `limit` rows.
pub fn preview_data_dir(data_dir: &Path, limit: usize) -> Result<DatasetPreview, LabError> {
    let summary = inspect_data_dir(data_dir)?;
    let files = DataFiles::find(data_dir)?;
    let file = std::fs::File::open(&files.train).map_err(|e| LabError::io(&files.train, e))?;
    let mut rows = Vec::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(file)) {
        if rows.len() >= limit {
            break;
        }
        let line = line.map_err(|e| LabError::io(&files.train, e))?;
        if let Ok(v) = serde_json::from_str(&line) {
            rows.push(v);
        }
    }
    Ok(DatasetPreview { summary, rows })
}

/// The files a `data_dir` stands for.
struct DataFiles {
    train: PathBuf,
    valid: Option<PathBuf>,
}

impl DataFiles {
    /// A folder's `train.jsonl` and, if present, `valid.jsonl`; or the one file given.
    fn find(data_dir: &Path) -> Result<Self, LabError> {
        let meta = std::fs::metadata(data_dir).map_err(|e| LabError::io(data_dir, e))?;
        if !meta.is_dir() {
            return Ok(DataFiles {
                train: data_dir.to_path_buf(),
                valid: None,
            });
        }
        let train = data_dir.join("train.jsonl");
        if !train.is_file() {
            return Err(LabError::data(
                &train,
                0,
                "not found: a data folder needs train.jsonl",
            ));
        }
        let valid = Some(data_dir.join("valid.jsonl")).filter(|p| p.is_file());
        Ok(DataFiles { train, valid })
    }
}

/// The number of rows of a file and their format.
fn count_rows(path: &Path) -> Result<(usize, DataFormat), LabError> {
    let mut n = 0usize;
    let format = read_rows(path, |_, _| {
        n += 1;
        Ok(())
    })?;
    Ok((n, format))
}

/// The validation file must be in the training file's format: its metrics compare the same loss.
fn same_format(valid: &Path, got: DataFormat, train: DataFormat) -> Result<(), LabError> {
    if got == train {
        return Ok(());
    }
    Err(LabError::data(
        valid,
        0,
        format!("the rows are `{got}` but train.jsonl's are `{train}`"),
    ))
}

/// The examples kept so far and the counts of what was not.
#[derive(Default)]
struct Accumulator {
    sft: Vec<SftExample>,
    pairs: Vec<PreferenceExample>,
    rows: usize,
    dropped: usize,
    truncated: usize,
}

impl Accumulator {
    /// Truncates one row's example and keeps it if it still has a loss token.
    fn add(&mut self, mut example: Tokenized, max_len: usize) {
        self.rows += 1;
        let (cut, usable) = example.truncate(max_len);
        self.truncated += usize::from(cut);
        if !usable {
            self.dropped += 1;
            return;
        }
        match example {
            Tokenized::Sft(ex) => self.sft.push(ex),
            Tokenized::Preference(pair) => self.pairs.push(pair),
        }
    }

    /// The dataset, or an error when no row was kept.
    fn finish(self, path: &Path, format: DataFormat, max_len: usize) -> Result<Dataset, LabError> {
        let examples = match format {
            DataFormat::Preference => Examples::Preference(self.pairs),
            _ => Examples::Sft(self.sft),
        };
        if examples.is_empty() {
            return Err(LabError::data(
                path,
                0,
                format!(
                    "no usable examples: all {} rows were left without a loss token at \
                     max_seq_length {max_len}",
                    self.rows
                ),
            ));
        }
        Ok(Dataset {
            format,
            examples,
            dropped: self.dropped,
            truncated: self.truncated,
        })
    }
}
