//! What every handler shares: the models (each with its facts and gateway), the server's
//! settings.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use kiln_engine::Engine;
use kiln_model::backend::Backend;
use kiln_model::chat_template::ChatTemplate;
use kiln_model::files::GenerationDefaults;
use kiln_model::tokenizer::KilnTokenizer;

use crate::models::Models;

/// Facts about the served model that the HTTP side needs (tokenizing, templating, limits).
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The id echoed in responses and listed by `/v1/models`.
    pub id: String,
    /// Tokenizer (a copy; the engine keeps its own).
    pub tokenizer: KilnTokenizer,
    /// Chat template, if the model ships one.
    pub template: Option<ChatTemplate>,
    /// `generation_config.json` defaults.
    pub generation: GenerationDefaults,
    /// KV positions (prompt + generated).
    pub context_len: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// How KV is stored, shown on the chat page and in `/stats`.
    pub kv_scheme: String,
    /// KV bytes per cached position (all layers, keys and values).
    pub kv_bytes_per_token: u64,
    /// Seconds the load took.
    pub load_secs: f64,
    /// Architecture name.
    pub arch: String,
    /// The memory model's verdict, computed once at startup: requests whose prompt plus
    /// `max_tokens` exceed its safe context are refused before any compute.
    pub memory: Option<MemoryAdmission>,
    /// How an embedding model pools (`None`: a generative model).
    pub embedding: Option<kiln_model::embedding::EmbeddingConfig>,
    /// An embedding's dimensions (the hidden size, or the last Dense module's output).
    pub embedding_width: usize,
    /// Structured-output compiler for this vocabulary, built on first use (shared by clones).
    pub grammar: Arc<std::sync::OnceLock<Result<kiln_engine::structured::GrammarCompiler, String>>>,
}

/// Memory admission (spec §6.7): what `kiln fit` says about the served model under its budget.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryAdmission {
    /// Where the budget came from (`--memory-budget`, or the process's room).
    pub budget_source: String,
    /// The fit at the served context.
    #[serde(flatten)]
    pub fit: kiln_engine::kv_scheme::memory::FitReport,
}

impl ModelInfo {
    /// Facts of the model `engine` serves, under `id`.
    pub fn from_engine<B: Backend>(engine: &Engine<B>, id: impl Into<String>) -> Self {
        let m = engine.model();
        let c = &m.config;
        Self {
            id: id.into(),
            tokenizer: m.tokenizer.clone(),
            template: m.chat_template.clone(),
            generation: m.generation.clone(),
            context_len: engine.options().context_len,
            vocab_size: c.vocab_size,
            kv_scheme: engine.options().kv_scheme.cache_key(),
            kv_bytes_per_token: kiln_engine::kv_scheme::memory::KvGeometry::new(
                c,
                &engine.options().kv_scheme,
                engine.backend().memory_profile().caps_sliding,
            )
            .bytes_per_token(),
            load_secs: m.load_secs,
            arch: format!("{:?}", c.arch),
            memory: None,
            embedding: m.embedding.clone(),
            embedding_width: (m.embedding.as_ref())
                .map_or(c.hidden_size, |e| e.width(c.hidden_size)),
            grammar: Arc::default(),
        }
    }

    /// The tool-call markup the model's chat template uses.
    pub fn tool_format(&self) -> crate::tools::ToolFormat {
        self.template
            .as_ref()
            .map_or(crate::tools::ToolFormat::Generic, |t| {
                crate::tools::ToolFormat::detect(t.source())
            })
    }

    /// The structured-output compiler (its vocabulary trie is built on the first call).
    pub fn grammar_compiler(
        &self,
    ) -> Result<&kiln_engine::structured::GrammarCompiler, crate::errors::ApiError> {
        self.grammar
            .get_or_init(|| {
                kiln_engine::structured::GrammarCompiler::new(&self.tokenizer, self.vocab_size)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| crate::errors::ApiError::bad_request(e.clone()))
    }
}

/// Server settings from the command line.
#[derive(Debug, Clone, Default)]
pub struct ServerConfig {
    /// Required API key, if any.
    pub api_key: Option<String>,
    /// Default `max_tokens` (`--max-tokens`).
    pub max_tokens: Option<usize>,
    /// Default temperature (`--temperature`).
    pub temperature: Option<f32>,
    /// Default top-p (`--top-p`).
    pub top_p: Option<f32>,
    /// Default top-k (`--top-k`).
    pub top_k: Option<usize>,
    /// Prompt-cache byte cap (`--prompt-cache-bytes`).
    pub prompt_cache_bytes: u64,
    /// The one origin allowed cross-origin requests (`--cors-origin`).
    pub cors_origin: Option<String>,
    /// Largest request body accepted.
    pub body_limit: usize,
    /// Connection timeouts and cap.
    pub limits: crate::listen::ConnectionLimits,
    /// Folders whose adapter subfolders `GET /v1/adapters/available` lists (fine-tune outputs).
    pub adapter_dirs: Vec<std::path::PathBuf>,
    /// How embeddings are normalized (`--embd-normalize`, llama-server's numbering: -1 none,
    /// 0 max-abs to int16, 1 taxicab, 2 euclidean, p > 2 p-norm); `None`: 2.
    pub embd_normalize: Option<i32>,
    /// Most inputs one embeddings request may carry (`--max-batch-inputs`); 0: the default.
    pub max_batch_inputs: usize,
}

/// Shared handler state.
pub struct AppState {
    /// The loaded models and how to load more.
    pub models: Arc<Models>,
    /// Settings.
    pub config: ServerConfig,
    /// Where the server listens (for the Host check on loopback).
    pub local_addr: SocketAddr,
    /// Unix seconds at start.
    pub started_at: u64,
    /// Sections other subsystems add to `/stats` (e.g. `jobs`), by key.
    pub extra_stats: Vec<(String, StatsHook)>,
    /// Extension paths that need no API key (`/` at the end: a prefix).
    pub open_paths: Vec<&'static str>,
    /// Every route the app answers: [`crate::routes::ROUTES`] and the extensions'.
    pub routes: Vec<crate::routes::RouteDoc>,
    /// Stored Responses turns for `previous_response_id`.
    pub responses: crate::openai::responses::store::ResponseStore,
    weyl: AtomicU64,
    ids: AtomicU64,
}

/// Produces one `/stats` section.
pub type StatsHook = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Handler state handle.
pub type SharedState = Arc<AppState>;

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl AppState {
    /// New state.
    pub fn new(models: Arc<Models>, config: ServerConfig, local_addr: SocketAddr) -> Self {
        Self {
            models,
            config,
            local_addr,
            started_at: unix_now(),
            extra_stats: Vec::new(),
            open_paths: Vec::new(),
            routes: crate::routes::ROUTES.to_vec(),
            responses: Default::default(),
            weyl: AtomicU64::new(0),
            ids: AtomicU64::new(0),
        }
    }

    /// A fresh seed for a request that gave none: clock bits XOR a Weyl sequence, so two
    /// requests in the same millisecond still differ (spec §3.1).
    pub fn fresh_seed(&self) -> u64 {
        let w = self
            .weyl
            .fetch_add(0x9e37_79b9, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (nanos & 0xffff_ffff) ^ (w & 0xffff_ffff)
    }

    /// A unique id with `prefix` (`chatcmpl-`, `msg_`, `call_`…).
    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        format!("{prefix}{:016x}{:06x}", nanos ^ (n << 40), n & 0xff_ffff)
    }
}
