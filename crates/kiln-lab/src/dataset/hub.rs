//! `hf_dataset_import`: rows of a Hugging Face dataset through the hub's datasets API
//! (`/splits`, `/rows`), with retries, and a plain error when the hub cannot be reached.

use std::time::Duration;

use serde_json::Value;

use super::Gen;
use super::output::Row;
use super::templates::{Inputs, OutputFormat};
use crate::LabError;

/// The datasets API; `KILN_HF_DATASETS_URL` points elsewhere (a mirror, a test server).
pub const DEFAULT_API: &str = "https://datasets-server.huggingface.co";

/// Rows per `/rows` page (the API's most).
const PAGE: usize = 100;

/// Waits before the second and third tries (spec §9).
const BACKOFF: [Duration; 2] = [Duration::from_millis(500), Duration::from_secs(1)];

/// The import: picks the config (the given one, else the first that has the split), pages
/// through `/rows`, filters by label and length, and maps columns to `output_format`.
pub fn import(g: &mut Gen) -> Result<Vec<Row>, LabError> {
    let api = std::env::var("KILN_HF_DATASETS_URL").unwrap_or_else(|_| DEFAULT_API.into());
    let api = api.trim_end_matches('/');
    let client = Client::new(api);
    let inputs = g.inputs;
    let id = inputs.text("hf_id").trim();
    let split = inputs.text("split").trim();
    let format = output_format(inputs)?;
    let config = pick_config(&client, id, inputs.text("config").trim(), split)?;
    let max = inputs.number("max_rows") as usize;
    let mut rows = Vec::new();
    let mut offset = 0;
    loop {
        let url = format!(
            "{api}/rows?dataset={}&config={}&split={}&offset={offset}&length={PAGE}",
            crate::percent_encode(id),
            crate::percent_encode(&config),
            crate::percent_encode(split)
        );
        let page = client.get(&url)?;
        let got = page["rows"].as_array().cloned().unwrap_or_default();
        let total = page["num_rows_total"].as_u64().unwrap_or(0) as usize;
        for r in &got {
            if max > 0 && rows.len() >= max {
                break;
            }
            if let Some(row) = map_row(&r["row"], format, inputs) {
                rows.push(row);
            }
        }
        offset += got.len();
        g.progress
            .step(offset.min(total), total.max(1), "fetching rows")?;
        if got.is_empty() || offset >= total || (max > 0 && rows.len() >= max) {
            return Ok(rows);
        }
    }
}

fn output_format(inputs: &Inputs) -> Result<OutputFormat, LabError> {
    OutputFormat::parse(inputs.text("output_format").trim()).ok_or_else(|| {
        LabError::config(
            "inputs.output_format",
            "must be text, messages, prompt_completion or dpo",
        )
    })
}

/// `output_format` names a format.
pub(super) fn check_inputs(inputs: &Inputs) -> Result<(), LabError> {
    output_format(inputs).map(|_| ())
}

/// The given config, or the first listed one that has `split`.
fn pick_config(client: &Client, id: &str, given: &str, split: &str) -> Result<String, LabError> {
    let splits = client.get(&format!(
        "{}/splits?dataset={}",
        client.api,
        crate::percent_encode(id)
    ))?;
    let list = splits["splits"].as_array().cloned().unwrap_or_default();
    let has = |c: &Value| c["split"].as_str() == Some(split);
    let found = list
        .iter()
        .filter(|c| has(c))
        .filter_map(|c| c["config"].as_str())
        .find(|c| given.is_empty() || *c == given);
    match found {
        Some(c) => Ok(c.to_string()),
        None => {
            let configs: Vec<String> = list
                .iter()
                .filter_map(|c| {
                    Some(format!(
                        "{}/{}",
                        c["config"].as_str()?,
                        c["split"].as_str()?
                    ))
                })
                .collect();
            Err(LabError::config(
                if given.is_empty() {
                    "inputs.split"
                } else {
                    "inputs.config"
                },
                format!(
                    "{id} has no {split:?} split{} (it has: {})",
                    if given.is_empty() {
                        String::new()
                    } else {
                        format!(" in config {given:?}")
                    },
                    configs.join(", ")
                ),
            ))
        }
    }
}

/// One dataset row in `format`, or `None` when it lacks the columns, fails the label filter,
/// or (text) is shorter than `min_chars`.
fn map_row(row: &Value, format: OutputFormat, inputs: &Inputs) -> Option<Row> {
    let label_column = inputs.text("label_column").trim();
    let filter = inputs.text("label_filter").trim();
    if !label_column.is_empty() && !filter.is_empty() {
        let label = match &row[label_column] {
            Value::String(s) => s.clone(),
            Value::Null => return None,
            other => other.to_string(),
        };
        if label != filter {
            return None;
        }
    }
    let s = |k: &str| row[k].as_str().map(str::trim).filter(|v| !v.is_empty());
    match format {
        OutputFormat::Text => {
            let text = s(inputs.text("text_column"))?;
            let min = inputs.number("min_chars") as usize;
            (text.chars().count() >= min).then(|| Row::text(text))
        }
        OutputFormat::Messages => row["messages"].as_array().map(|m| Row::messages(m.clone())),
        OutputFormat::PromptCompletion => {
            Some(Row::prompt_completion(s("prompt")?, s("completion")?))
        }
        OutputFormat::Dpo => Some(Row::dpo(s("prompt")?, s("chosen")?, s("rejected")?)),
    }
}

/// GETs with retries; `HF_TOKEN` is sent for gated datasets.
struct Client {
    api: String,
    agent: ureq::Agent,
    token: Option<String>,
}

impl Client {
    fn new(api: &str) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
        Client {
            api: api.to_string(),
            agent,
            token,
        }
    }

    fn get(&self, url: &str) -> Result<Value, LabError> {
        let mut last = String::new();
        for attempt in 0..=BACKOFF.len() {
            if attempt > 0 {
                std::thread::sleep(BACKOFF[attempt - 1]);
            }
            let mut req = self.agent.get(url);
            if let Some(t) = &self.token {
                req = req.header("authorization", &format!("Bearer {t}"));
            }
            let mut resp = match req.call() {
                Ok(r) => r,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let status = resp.status();
            let body = resp
                .body_mut()
                .with_config()
                .limit(64 << 20)
                .read_to_string()
                .unwrap_or_default();
            if status.is_success() {
                return serde_json::from_str(&body).map_err(|e| {
                    LabError::Generate(format!(
                        "the datasets API answered {url} with bad JSON: {e}"
                    ))
                });
            }
            let msg = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(body);
            if status.is_client_error() && status.as_u16() != 429 {
                return Err(LabError::Generate(format!(
                    "the datasets API refused {url}: {status}: {msg}"
                )));
            }
            last = format!("{status}: {msg}");
        }
        Err(LabError::Generate(format!(
            "the Hugging Face datasets API ({}) is not reachable from this machine: {last}. Download the dataset elsewhere and use format_conversion, or set KILN_HF_DATASETS_URL to a mirror",
            self.api
        )))
    }
}
