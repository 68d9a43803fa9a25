//! Turning whatever the user typed into a model on disk, and listing what is
//! cached.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{HubError, Result};
use crate::hf;
use crate::hub::{Hub, HubFileSpec};

/// The two shapes a model comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelKind {
    /// A single GGUF file.
    GgufFile,
    /// A Hugging Face folder: `config.json`, tokenizer files, safetensors.
    HfFolder,
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ModelKind::GgufFile => "gguf",
            ModelKind::HfFolder => "hf-folder",
        })
    }
}

/// A model found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    /// The `.gguf` file or the folder holding `config.json`.
    pub path: PathBuf,
    /// Which of the two it is.
    pub kind: ModelKind,
}

/// One entry of [`Hub::list_cached`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedModel {
    /// What to type to use it: a file name in kiln's cache, `org/name` for
    /// an HF folder, `org/name/file.gguf` for a GGUF in the HF cache.
    pub name: String,
    /// Where it is.
    pub path: PathBuf,
    /// Bytes on disk (the whole snapshot for a folder).
    pub size_bytes: u64,
    /// File or folder.
    pub kind: ModelKind,
}

impl Hub {
    /// Resolves a model spec, in this order:
    ///
    /// 1. a catalog name (`smollm2`, `smollm2-135m`, `SmolLM2-135M-Instruct`,
    ///    `default`, or empty): the starter model, pulled if missing;
    /// 2. an existing path: a `.gguf` file (or a file with GGUF magic), or a
    ///    folder with `config.json` (a folder with a single `.gguf` also works);
    /// 3. a file name in `<cache>/models` (`.gguf` may be left off);
    /// 4. `org/name[@revision]` in the HF hub cache, or
    ///    `org/name[@revision]/file.gguf` there or (pulled) in `<cache>/models`.
    ///
    /// Only the catalog names touch the network.
    pub fn resolve_model(&self, spec: &str, progress: bool) -> Result<ResolvedModel> {
        let spec = spec.trim();
        if let Some(model) = self.known(spec) {
            return Ok(ResolvedModel {
                path: self.ensure_known(model, progress)?,
                kind: ModelKind::GgufFile,
            });
        }
        let mut tried = Vec::new();

        let path = expand_tilde(spec);
        if path.exists() {
            return classify_local(&path);
        }
        tried.push(format!("local path {} (does not exist)", path.display()));

        let models = self.models_dir();
        if !spec.contains(['/', '\\']) {
            let mut candidates = vec![models.join(spec)];
            if !spec.to_ascii_lowercase().ends_with(".gguf") {
                candidates.push(models.join(format!("{spec}.gguf")));
            }
            for candidate in candidates {
                if candidate.is_file() {
                    return Ok(ResolvedModel {
                        path: candidate,
                        kind: ModelKind::GgufFile,
                    });
                }
                tried.push(format!("kiln cache {} (not found)", candidate.display()));
            }
        }

        let (repo, revision) = match spec.split_once('@') {
            Some((repo, rev)) if !rev.contains('/') => (repo, Some(rev)),
            _ => (spec, None),
        };
        if hf::is_repo_id(repo) {
            let dir = hf::repo_dir(self.hf_cache_dir(), repo);
            match hf::snapshot_dir(&dir, revision) {
                Ok(snapshot) => return classify_local(&snapshot),
                Err(where_) => tried.push(format!("Hugging Face cache {where_}")),
            }
        } else if let Some(file) = HubFileSpec::parse(spec) {
            let dir = hf::repo_dir(self.hf_cache_dir(), &file.repo);
            let revision = (file.revision != "main").then_some(file.revision.as_str());
            match hf::snapshot_dir(&dir, revision) {
                Ok(snapshot) => {
                    let candidate = snapshot.join(&file.path);
                    if candidate.is_file() {
                        return Ok(ResolvedModel {
                            path: candidate,
                            kind: ModelKind::GgufFile,
                        });
                    }
                    tried.push(format!(
                        "Hugging Face cache {} (not found)",
                        candidate.display()
                    ));
                }
                Err(where_) => tried.push(format!("Hugging Face cache {where_}")),
            }
            let name = file.path.rsplit('/').next().unwrap_or(&file.path);
            let candidate = models.join(name);
            if candidate.is_file() {
                return Ok(ResolvedModel {
                    path: candidate,
                    kind: ModelKind::GgufFile,
                });
            }
            tried.push(format!("kiln cache {} (not found)", candidate.display()));
        }

        let names: Vec<String> = self
            .catalog()
            .iter()
            .flat_map(|m| std::iter::once(m.name.clone()).chain(m.aliases.iter().cloned()))
            .collect();
        Err(HubError::NotFound {
            spec: spec.to_string(),
            tried,
            hint: Some(format!(
                "known model names: {}; `kiln pull org/repo/file.gguf` or a URL downloads others",
                names.join(", ")
            )),
        })
    }

    /// Models in kiln's cache (`<cache>/models/*.gguf`) and in the HF hub
    /// cache (folders with `config.json`, and `.gguf` files), sorted by name.
    /// Unreadable entries are skipped.
    pub fn list_cached(&self) -> Vec<CachedModel> {
        let mut out = Vec::new();
        if let Ok(entries) = fs::read_dir(self.models_dir()) {
            for entry in entries.filter_map(|e| e.ok()) {
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || !name.to_ascii_lowercase().ends_with(".gguf") {
                    continue;
                }
                if let Ok(meta) = fs::metadata(&path)
                    && meta.is_file()
                {
                    out.push(CachedModel {
                        name,
                        path,
                        size_bytes: meta.len(),
                        kind: ModelKind::GgufFile,
                    });
                }
            }
        }
        if let Ok(entries) = fs::read_dir(self.hf_cache_dir()) {
            for entry in entries.filter_map(|e| e.ok()) {
                let dir_name = entry.file_name().to_string_lossy().into_owned();
                let Some(repo) = hf::repo_from_dir_name(&dir_name) else {
                    continue;
                };
                let Ok(snapshot) = hf::snapshot_dir(&entry.path(), None) else {
                    continue;
                };
                if snapshot.join("config.json").is_file() {
                    out.push(CachedModel {
                        name: repo.clone(),
                        size_bytes: dir_size(&snapshot, 4),
                        path: snapshot.clone(),
                        kind: ModelKind::HfFolder,
                    });
                }
                let mut ggufs = Vec::new();
                find_ggufs(&snapshot, 4, &mut ggufs);
                for path in ggufs {
                    let rel = path.strip_prefix(&snapshot).unwrap_or(&path);
                    let rel = rel.to_string_lossy().replace('\\', "/");
                    out.push(CachedModel {
                        name: format!("{repo}/{rel}"),
                        // Snapshot entries are symlinks into blobs/; metadata follows them.
                        size_bytes: fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
                        path,
                        kind: ModelKind::GgufFile,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name).then(a.path.cmp(&b.path)));
        out
    }
}

/// `~/x` → `$HOME/x`; anything else unchanged.
fn expand_tilde(spec: &str) -> PathBuf {
    if let Some(rest) = spec.strip_prefix("~/")
        && let Some(home) = dirs::home_dir()
    {
        return home.join(rest);
    }
    PathBuf::from(spec)
}

/// Classifies an existing path as a GGUF file or an HF folder.
fn classify_local(path: &Path) -> Result<ResolvedModel> {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let invalid = |reason: String| HubError::InvalidSpec {
        spec: path.display().to_string(),
        reason,
    };
    if path.is_file() {
        let by_name = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        if by_name || has_gguf_magic(&path) {
            return Ok(ResolvedModel {
                path,
                kind: ModelKind::GgufFile,
            });
        }
        return Err(invalid(
            "not a GGUF file (no .gguf extension, no GGUF magic)".into(),
        ));
    }
    if path.join("config.json").is_file() {
        return Ok(ResolvedModel {
            path,
            kind: ModelKind::HfFolder,
        });
    }
    let mut ggufs = Vec::new();
    find_ggufs(&path, 1, &mut ggufs);
    match ggufs.len() {
        1 => Ok(ResolvedModel {
            path: ggufs.remove(0),
            kind: ModelKind::GgufFile,
        }),
        0 => Err(invalid(
            "folder has neither config.json nor a .gguf file".into(),
        )),
        _ => {
            let names: Vec<String> = ggufs
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            Err(invalid(format!(
                "folder holds several .gguf files; name one: {}",
                names.join(", ")
            )))
        }
    }
}

fn has_gguf_magic(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

/// `.gguf` files under `dir`, at most `depth` levels down, sorted.
fn find_ggufs(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            if depth > 1 {
                find_ggufs(&path, depth - 1, out);
            }
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            && path.is_file()
        {
            out.push(path);
        }
    }
}

/// Total size of the files under `dir` (following symlinks), `depth` levels deep.
fn dir_size(dir: &Path, depth: usize) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match fs::metadata(e.path()) {
            Ok(m) if m.is_dir() && depth > 1 => dir_size(&e.path(), depth - 1),
            Ok(m) if m.is_file() => m.len(),
            _ => 0,
        })
        .sum()
}
