//! kiln's lab: the job kinds that make models and their data: `quantize` (uniform and mixed
//! precision, GGUF and MLX output), `finetune` (LoRA) and `dataset` (spec §9's templates), and
//! the lab's HTTP routes and pages.

pub mod dataset;
pub mod error;
pub mod finetune;
pub mod http;
pub mod quantize;
pub mod report;
mod rng;

pub use error::LabError;
pub use report::Report;

/// `~/x` → `$HOME/x`; other paths unchanged.
pub fn expand_home(path: &str) -> std::path::PathBuf {
    let path = path.trim();
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => std::path::Path::new(&home).join(rest),
        _ => std::path::PathBuf::from(path),
    }
}

/// Percent-encodes what is not safe in a URL path segment or query value (RFC 3986
/// unreserved characters pass).
pub fn percent_encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
