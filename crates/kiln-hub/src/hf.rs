//! The Hugging Face side: hub URLs and the local hub cache layout
//! (`models--org--name/{refs,snapshots,blobs}`) that `huggingface_hub` writes.

use std::fs;
use std::path::{Path, PathBuf};

/// Default hub endpoint; `HF_ENDPOINT` overrides it.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The hub cache directory: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`
/// (the same order `huggingface_hub` uses).
pub fn hf_hub_cache_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return dir;
    }
    if let Some(home) = var("HF_HOME") {
        return home.join("hub");
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return xdg.join("huggingface").join("hub");
    }
    dirs::home_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join(".cache")
        .join("huggingface")
        .join("hub")
}

/// `{endpoint}/{repo}/resolve/{revision}/{file}`.
pub(crate) fn resolve_url(endpoint: &str, repo: &str, revision: &str, file: &str) -> String {
    format!(
        "{}/{repo}/resolve/{revision}/{file}",
        endpoint.trim_end_matches('/')
    )
}

/// True for `org/name` with characters the hub allows.
pub(crate) fn is_repo_id(s: &str) -> bool {
    let mut parts = s.split('/');
    let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ok = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    ok(org) && ok(name)
}

/// The cache folder of a repo: `<cache>/models--org--name`.
pub(crate) fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// The repo id a `models--org--name` folder name stands for.
pub(crate) fn repo_from_dir_name(name: &str) -> Option<String> {
    let rest = name.strip_prefix("models--")?;
    let (org, model) = rest.split_once("--")?;
    Some(format!("{org}/{model}"))
}

/// The snapshot folder for `revision` (a ref name such as `main`, or a
/// commit hash) of a cached repo. With no revision: `refs/main`, else the
/// only snapshot, else the most recently modified one.
pub(crate) fn snapshot_dir(repo_dir: &Path, revision: Option<&str>) -> Result<PathBuf, String> {
    let snapshots = repo_dir.join("snapshots");
    let read_ref = |name: &str| {
        fs::read_to_string(repo_dir.join("refs").join(name))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    if let Some(rev) = revision {
        let commit = read_ref(rev).unwrap_or_else(|| rev.to_string());
        let dir = snapshots.join(&commit);
        return if dir.is_dir() {
            Ok(dir)
        } else {
            Err(format!(
                "{} (no snapshot for revision {rev})",
                dir.display()
            ))
        };
    }
    if let Some(commit) = read_ref("main") {
        let dir = snapshots.join(&commit);
        if dir.is_dir() {
            return Ok(dir);
        }
        tracing::debug!("refs/main points at missing snapshot {}", dir.display());
    }
    let entries = fs::read_dir(&snapshots).map_err(|e| format!("{} ({e})", snapshots.display()))?;
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
        .ok_or_else(|| format!("{} (no snapshots)", snapshots.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids() {
        assert!(is_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(is_repo_id("org/name.v2"));
        assert!(!is_repo_id("org"));
        assert!(!is_repo_id("org/name/file.gguf"));
        assert!(!is_repo_id("./model"));
        assert!(!is_repo_id("../x"));
        assert!(!is_repo_id("/abs"));
        assert_eq!(
            repo_from_dir_name("models--HuggingFaceTB--SmolLM2-135M"),
            Some("HuggingFaceTB/SmolLM2-135M".into())
        );
        assert_eq!(repo_from_dir_name("datasets--a--b"), None);
        assert_eq!(
            resolve_url("https://hf.co/", "a/b", "main", "x.gguf"),
            "https://hf.co/a/b/resolve/main/x.gguf"
        );
    }
}
