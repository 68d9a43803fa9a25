//! Where kiln keeps models, and the `.verified` sidecar that makes repeated
//! verification of a large file free.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{HubError, Result};

/// Environment variable that overrides the cache directory.
pub const CACHE_DIR_ENV: &str = "KILN_CACHE_DIR";

/// kiln's cache directory: `$KILN_CACHE_DIR`, else `<platform cache dir>/kiln`
/// (`~/.cache/kiln` on Linux).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(CACHE_DIR_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    match dirs::cache_dir() {
        Some(dir) => dir.join("kiln"),
        None => {
            // No HOME or platform cache dir (some containers); a temp-dir cache
            // still works, it just does not survive reboots.
            let dir = std::env::temp_dir().join("kiln-cache");
            tracing::warn!(
                "no user cache directory; using {} (set {CACHE_DIR_ENV} to choose one)",
                dir.display()
            );
            dir
        }
    }
}

/// The directory that holds downloaded models: `<cache>/models`.
pub fn models_dir() -> PathBuf {
    cache_dir().join("models")
}

/// Hex sha256 of a file's whole content.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = fs::File::open(path).map_err(|e| HubError::io("opening", path, e))?;
    let mut hasher = Sha256::new();
    hash_reader(&mut file, &mut hasher, u64::MAX).map_err(|e| HubError::io("reading", path, e))?;
    Ok(hex::encode(hasher.finalize()))
}

/// Feeds up to `limit` bytes of `reader` to `hasher`; returns how many were read.
pub(crate) fn hash_reader(
    reader: &mut impl Read,
    hasher: &mut Sha256,
    limit: u64,
) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    while total < limit {
        let want = usize::try_from((limit - total).min(buf.len() as u64)).unwrap_or(buf.len());
        let n = match reader.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok(total)
}

/// `<file>.<suffix>` next to `file` (suffix appended, not replacing the extension).
pub(crate) fn with_suffix(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".");
    name.push(suffix);
    file.with_file_name(name)
}

/// The sidecar path for `file`: `<file>.verified`.
pub fn sidecar_path(file: &Path) -> PathBuf {
    with_suffix(file, "verified")
}

/// Content of a `.verified` sidecar: the hash of the file as it was when it
/// was hashed, plus the size and mtime that identify "as it was".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Sidecar {
    sha256: String,
    size: u64,
    mtime_ns: u64,
}

fn stamp(path: &Path) -> Result<(u64, u64)> {
    let meta = fs::metadata(path).map_err(|e| HubError::io("reading metadata of", path, e))?;
    // A filesystem without mtimes yields 0, which just means "re-hash whenever
    // the size changes"; still correct for the files we write ourselves.
    let mtime_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    Ok((meta.len(), mtime_ns))
}

/// Records that `file` (as it is now) hashes to `sha256`.
///
/// Written to a temp file and renamed, so a crash never leaves a truncated
/// sidecar that would have to be parsed.
pub(crate) fn write_sidecar(file: &Path, sha256: &str) -> Result<()> {
    let (size, mtime_ns) = stamp(file)?;
    let record = Sidecar {
        sha256: sha256.to_ascii_lowercase(),
        size,
        mtime_ns,
    };
    let side = sidecar_path(file);
    let tmp = with_suffix(&side, "tmp");
    let text = serde_json::to_string(&record).map_err(|e| HubError::Io {
        action: "serializing",
        path: side.clone(),
        message: e.to_string(),
        kind: io::ErrorKind::InvalidData,
    })?;
    let mut f = fs::File::create(&tmp).map_err(|e| HubError::io("creating", &tmp, e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| HubError::io("writing", &tmp, e))?;
    drop(f);
    fs::rename(&tmp, &side).map_err(|e| HubError::io("renaming", &tmp, e))
}

/// The sha256 a still-valid sidecar records for `file`, if any.
///
/// "Still valid" means the file's size and mtime are what they were when it
/// was hashed; anything else (missing, unparsable, stale) yields `None`.
pub(crate) fn sidecar_sha(file: &Path) -> Option<String> {
    let text = fs::read_to_string(sidecar_path(file)).ok()?;
    let record: Sidecar = serde_json::from_str(&text).ok()?;
    let (size, mtime_ns) = stamp(file).ok()?;
    (record.size == size && record.mtime_ns == mtime_ns).then_some(record.sha256)
}

/// Outcome of [`verify_file`].
#[derive(Debug)]
pub(crate) enum Verification {
    /// The file matches; `cached` says whether the sidecar vouched for it.
    Ok { cached: bool },
    /// The file exists but does not match.
    Mismatch(HubError),
}

/// Checks `file` against an expected size and sha256, trusting a valid
/// sidecar and otherwise hashing (then recording a successful hash).
pub(crate) fn verify_file(file: &Path, sha256: &str, size: Option<u64>) -> Result<Verification> {
    let what = file.display().to_string();
    let (actual_size, _) = stamp(file)?;
    if let Some(expected) = size
        && expected != actual_size
    {
        return Ok(Verification::Mismatch(HubError::SizeMismatch {
            what,
            expected,
            actual: actual_size,
        }));
    }
    if let Some(recorded) = sidecar_sha(file)
        && recorded.eq_ignore_ascii_case(sha256)
    {
        return Ok(Verification::Ok { cached: true });
    }
    let actual = sha256_file(file)?;
    if !actual.eq_ignore_ascii_case(sha256) {
        return Ok(Verification::Mismatch(HubError::ShaMismatch {
            what,
            expected: sha256.to_ascii_lowercase(),
            actual,
        }));
    }
    // A failed sidecar write only costs a re-hash next time.
    if let Err(e) = write_sidecar(file, &actual) {
        tracing::warn!("could not record verification: {e}");
    }
    Ok(Verification::Ok { cached: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecar_round_trip_and_staleness() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("m.gguf");
        fs::write(&file, b"hello").expect("write");
        let sha = sha256_file(&file).expect("hash");
        assert_eq!(
            sha,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert!(matches!(
            verify_file(&file, &sha, Some(5)).expect("verify"),
            Verification::Ok { cached: false }
        ));
        assert_eq!(sidecar_sha(&file).as_deref(), Some(sha.as_str()));
        assert!(matches!(
            verify_file(&file, &sha, Some(5)).expect("verify"),
            Verification::Ok { cached: true }
        ));
        // Changing the content (and so the size) makes the sidecar stale.
        fs::write(&file, b"hello!").expect("write");
        assert_eq!(sidecar_sha(&file), None);
        match verify_file(&file, &sha, None).expect("verify") {
            Verification::Mismatch(e) => {
                let msg = e.to_string();
                assert!(msg.contains(&sha), "{msg}");
                assert!(msg.contains("m.gguf"), "{msg}");
            }
            other => panic!("expected mismatch, got {other:?}"),
        }
    }

    #[test]
    fn size_mismatch_is_reported_without_hashing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("m.gguf");
        fs::write(&file, b"abc").expect("write");
        match verify_file(&file, "00", Some(4)).expect("verify") {
            Verification::Mismatch(HubError::SizeMismatch {
                expected, actual, ..
            }) => assert_eq!((expected, actual), (4, 3)),
            other => panic!("expected size mismatch, got {other:?}"),
        }
    }
}
