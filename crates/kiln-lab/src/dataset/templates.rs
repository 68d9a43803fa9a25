//! The 13 templates of spec §9 as data: what each needs, its defaults and its row format. The
//! page and the CLI are built from these, and submitted inputs are checked against them.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::LabError;

/// The row format a template writes (spec §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// `{messages:[…]}`.
    Messages,
    /// `{prompt, completion}`.
    PromptCompletion,
    /// `{prompt, chosen, rejected}`.
    Dpo,
    /// `{text}`.
    Text,
}

impl OutputFormat {
    /// The name used in configs and TemplateDefs.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "messages" => Some(Self::Messages),
            "prompt_completion" => Some(Self::PromptCompletion),
            "dpo" => Some(Self::Dpo),
            "text" => Some(Self::Text),
            _ => None,
        }
    }
}

/// How a field is entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldType {
    /// One line.
    Text,
    /// Several lines.
    Textarea,
    /// A number.
    Number,
}

/// One input of a template.
#[derive(Debug, Clone, Serialize)]
pub struct FieldDef {
    /// The input's key.
    pub name: &'static str,
    /// How it is entered.
    #[serde(rename = "type")]
    pub kind: FieldType,
    /// What the page shows.
    pub label: &'static str,
    /// A short help text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<&'static str>,
    /// Whether the template cannot run without it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
    /// The value used when it is absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

/// One template (spec §9's TemplateDef, plus whether it calls the served model).
#[derive(Debug, Clone, Serialize)]
pub struct TemplateDef {
    /// The `template_id`.
    pub id: &'static str,
    /// A short name.
    pub label: &'static str,
    /// What it makes.
    pub description: &'static str,
    /// Its rows' format.
    pub output_format: OutputFormat,
    /// Whether it calls the served model's `/v1/chat/completions`.
    pub llm: bool,
    /// Its inputs.
    pub fields: Vec<FieldDef>,
}

fn field(name: &'static str, kind: FieldType, label: &'static str) -> FieldDef {
    FieldDef {
        name,
        kind,
        label,
        hint: None,
        required: false,
        default: None,
    }
}

impl FieldDef {
    fn required(mut self) -> Self {
        self.required = true;
        self
    }
    fn hint(mut self, hint: &'static str) -> Self {
        self.hint = Some(hint);
        self
    }
    fn default(mut self, v: impl Into<Value>) -> Self {
        self.default = Some(v.into());
        self
    }
}

use FieldType::{Number, Text, Textarea};
use OutputFormat::{Dpo, Messages, PromptCompletion};

fn def(
    id: &'static str,
    label: &'static str,
    description: &'static str,
    output_format: OutputFormat,
    llm: bool,
    fields: Vec<FieldDef>,
) -> TemplateDef {
    TemplateDef {
        id,
        label,
        description,
        output_format,
        llm,
        fields,
    }
}

/// Every template, in the spec's order.
pub fn all() -> Vec<TemplateDef> {
    let mut t = local_templates();
    t.extend(llm_templates());
    t
}

fn local_templates() -> Vec<TemplateDef> {
    vec![
        def(
            "sft_qa_pairs",
            "Q&A pairs",
            "Turns Q:/A: blocks into user/assistant chats.",
            Messages,
            false,
            vec![
                field("pairs_text", Textarea, "Question/answer blocks")
                    .required()
                    .hint(
                        "Q: a question\nA: its answer — one block per pair; answers may span lines",
                    ),
            ],
        ),
        def(
            "dpo_pref_pairs",
            "Preference pairs (CSV)",
            "Reads prompt,chosen,rejected rows from CSV for DPO/ORPO.",
            Dpo,
            false,
            vec![
                field(
                    "csv_text",
                    Textarea,
                    "CSV with header prompt,chosen,rejected",
                )
                .required()
                .hint("quote fields that hold commas or newlines"),
            ],
        ),
        def(
            "code_completion",
            "Code completion",
            "Splits the Python files of a folder at def/class into prompt → completion pairs.",
            PromptCompletion,
            false,
            vec![
                field("src_dir", Text, "Source folder")
                    .required()
                    .hint("every **/*.py below it, sorted"),
                field("max_pairs", Number, "Most pairs").default(500),
                field("seed", Number, "Seed of the split points").default(0),
            ],
        ),
        def(
            "hf_dataset_import",
            "Import from Hugging Face",
            "Fetches rows of a hub dataset through the datasets API.",
            OutputFormat::Text,
            false,
            vec![
                field("hf_id", Text, "Dataset id")
                    .required()
                    .hint("e.g. wikitext or org/name"),
                field("config", Text, "Config").hint("empty: the first config that has the split"),
                field("split", Text, "Split").default("train"),
                field("text_column", Text, "Text column").default("text"),
                field("label_column", Text, "Label column")
                    .hint("with a label filter: keep matching rows only"),
                field("label_filter", Text, "Label filter"),
                field("max_rows", Number, "Most rows (0 = all)").default(1000),
                field("min_chars", Number, "Shortest text kept").default(200),
                field("output_format", Text, "Output format")
                    .default("text")
                    .hint("text, messages, prompt_completion or dpo (columns of those names)"),
            ],
        ),
        def(
            "format_conversion",
            "Convert JSONL",
            "Renames two fields of each JSONL record into a user/assistant chat.",
            Messages,
            false,
            vec![
                field("input_jsonl", Textarea, "JSONL records").required(),
                field("user_key", Text, "User field").default("input"),
                field("assistant_key", Text, "Assistant field").default("output"),
            ],
        ),
    ]
}

fn llm_templates() -> Vec<TemplateDef> {
    vec![
        def(
            "style_transfer",
            "Style transfer",
            "The served model rewrites each paragraph in the style of your samples.",
            PromptCompletion,
            true,
            vec![
                field("reference_samples", Textarea, "Samples of the style")
                    .required()
                    .hint("separate samples with a line of ---"),
                field("raw_text", Textarea, "Text to rewrite")
                    .required()
                    .hint("one paragraph per row; blank lines separate them"),
            ],
        ),
        def(
            "self_instruct",
            "Self-instruct",
            "The served model writes variants of each seed instruction, then answers them.",
            Messages,
            true,
            vec![
                field("seeds", Textarea, "Seed instructions")
                    .required()
                    .hint("one per line"),
                field("variants_per_seed", Number, "Variants per seed").default(5),
            ],
        ),
        def(
            "prompt_reconstruction",
            "Prompt reconstruction",
            "The served model infers the prompt that would have produced each target paragraph.",
            Messages,
            true,
            vec![
                field("target_text", Textarea, "Target text")
                    .required()
                    .hint("one paragraph per row"),
                field("style", Text, "Style").default("direct technical blog"),
                field("tone", Text, "Tone"),
                field("preserve", Text, "Preserve"),
                field("avoid", Text, "Avoid"),
            ],
        ),
        def(
            "multi_turn_chat",
            "Multi-turn chat",
            "The served model plays both sides of a conversation from each seed.",
            Messages,
            true,
            vec![
                field("seeds", Textarea, "Opening messages")
                    .required()
                    .hint("one per line"),
                field("turns", Number, "Assistant turns").default(4),
                field("persona", Text, "Assistant persona")
                    .default("You are a helpful, concise assistant."),
                field("user_persona", Text, "User persona").hint("how the simulated user behaves"),
            ],
        ),
        def(
            "tool_use_traces",
            "Tool-use traces",
            "The served model answers scenarios with your tools; tool results are mocked.",
            Messages,
            true,
            vec![
                field("tools_json", Textarea, "Tools (OpenAI JSON)")
                    .required()
                    .hint("[{\"type\":\"function\",\"function\":{\"name\":…,\"parameters\":…}}]"),
                field("scenarios", Textarea, "Scenarios")
                    .required()
                    .hint("one user request per line"),
                field("mock_results", Textarea, "Mocked results")
                    .hint("JSON object: tool name → result; otherwise a generic result"),
            ],
        ),
        def(
            "rag_qa",
            "Grounded Q&A",
            "Chunks your documents; the served model writes questions answered by each chunk.",
            Messages,
            true,
            vec![
                field("documents", Textarea, "Documents")
                    .required()
                    .hint("separate documents with a line of ---"),
                field("questions_per_chunk", Number, "Questions per chunk").default(2),
                field("min_chunk_chars", Number, "Smallest chunk").default(200),
            ],
        ),
        def(
            "cot_synthesis",
            "Reasoning traces",
            "The served model reasons step by step, then answers each question.",
            Messages,
            true,
            vec![
                field("questions", Textarea, "Questions")
                    .required()
                    .hint("one per line"),
                field("category", Text, "Domain hint").hint("e.g. arithmetic, logic"),
            ],
        ),
        def(
            "verified_code",
            "Verified code",
            "The served model writes code with three asserts; python3 checks them.",
            Messages,
            true,
            vec![
                field("specs", Textarea, "Specifications")
                    .required()
                    .hint("one function to write per line"),
                field("language", Text, "Language")
                    .default("python")
                    .hint("only python is verified"),
            ],
        ),
    ]
}

/// The template `id`.
pub fn find(id: &str) -> Option<TemplateDef> {
    all().into_iter().find(|t| t.id == id)
}

/// A template's inputs, checked and with defaults filled in.
#[derive(Debug, Clone)]
pub struct Inputs {
    values: Map<String, Value>,
}

impl Inputs {
    /// Checks `given` against `def`: every key must be a field, text fields take strings,
    /// number fields non-negative integers (or strings of them), required fields must be
    /// non-blank. Errors name the field as `inputs.<name>`.
    pub fn check(def: &TemplateDef, given: &Map<String, Value>) -> Result<Self, LabError> {
        if let Some(unknown) = given
            .keys()
            .find(|k| !def.fields.iter().any(|f| f.name == *k))
        {
            let names: Vec<&str> = def.fields.iter().map(|f| f.name).collect();
            return Err(LabError::config(
                &format!("inputs.{unknown}"),
                format!(
                    "not an input of {} (its inputs: {})",
                    def.id,
                    names.join(", ")
                ),
            ));
        }
        let mut values = Map::new();
        for f in &def.fields {
            let v = match given.get(f.name) {
                None | Some(Value::Null) => f.default.clone(),
                Some(v) => Some(typed(f, v)?),
            };
            let blank = v
                .as_ref()
                .is_none_or(|v| v.as_str().is_some_and(|s| s.trim().is_empty()));
            if f.required && blank {
                return Err(LabError::config(
                    &format!("inputs.{}", f.name),
                    "is required",
                ));
            }
            if let Some(v) = v {
                values.insert(f.name.to_string(), v);
            }
        }
        Ok(Inputs { values })
    }

    /// A text input ("" when absent).
    pub fn text(&self, name: &str) -> &str {
        self.values.get(name).and_then(Value::as_str).unwrap_or("")
    }

    /// A number input (its default when absent; 0 when it has none).
    pub fn number(&self, name: &str) -> u64 {
        self.values.get(name).and_then(Value::as_u64).unwrap_or(0)
    }

    /// The inputs as JSON, defaults included.
    pub fn to_json(&self) -> Map<String, Value> {
        self.values.clone()
    }
}

/// Largest number input: bounds loops and allocations a hostile config could otherwise blow up.
const MAX_NUMBER: u64 = 1_000_000;

fn typed(f: &FieldDef, v: &Value) -> Result<Value, LabError> {
    let name = format!("inputs.{}", f.name);
    match (f.kind, v) {
        (Number, Value::Number(n)) => match n.as_u64() {
            Some(n) if n <= MAX_NUMBER => Ok(Value::from(n)),
            _ => Err(LabError::config(
                &name,
                format!("must be an integer in 0..={MAX_NUMBER}, got {n}"),
            )),
        },
        (Number, Value::String(s)) if s.trim().is_empty() => {
            Ok(f.default.clone().unwrap_or(Value::from(0)))
        }
        (Number, Value::String(s)) => match s.trim().parse::<u64>() {
            Ok(n) if n <= MAX_NUMBER => Ok(Value::from(n)),
            _ => Err(LabError::config(
                &name,
                format!("must be an integer in 0..={MAX_NUMBER}, got {s:?}"),
            )),
        },
        (Number, other) => Err(LabError::config(
            &name,
            format!("must be a number, got {other}"),
        )),
        (_, Value::String(s)) => Ok(Value::String(s.clone())),
        (_, Value::Number(n)) => Ok(Value::String(n.to_string())),
        (_, other) => Err(LabError::config(
            &name,
            format!("must be a string, got {other}"),
        )),
    }
}
