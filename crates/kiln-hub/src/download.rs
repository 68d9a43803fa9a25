//! Resumable, verified download of one URL to one file.
//!
//! Bytes go to `<dest>.part`; a later call (or a retry after a dropped
//! connection) continues it with an HTTP `Range` request. Only a file whose
//! size and sha256 check out is renamed to `dest`, so `dest` existing always
//! means "complete".

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};
use ureq::Agent;

use crate::cache::{hash_reader, with_suffix};
use crate::error::{HubError, Result};
use crate::http::is_sha256_hex;

/// How many times a download that broke off after making progress is resumed
/// within one call before giving up.
const MAX_RESUMES: u32 = 8;

/// One file to fetch.
#[derive(Debug, Clone)]
pub(crate) struct Download<'a> {
    /// Where to GET it.
    pub url: &'a str,
    /// The final path; `<dest>.part` holds the bytes until verified.
    pub dest: &'a Path,
    /// Pinned sha256 (hex), if known.
    pub sha256: Option<&'a str>,
    /// Pinned size in bytes, if known.
    pub size: Option<u64>,
    /// Bearer token to send (Hugging Face `HF_TOKEN`).
    pub bearer: Option<&'a str>,
    /// With no pinned hash, trust a sha256-shaped `X-Linked-Etag`/`ETag`
    /// (the Hugging Face hub sends the LFS object's sha256 there).
    pub sha_from_etag: bool,
    /// Shown next to the progress bar.
    pub label: &'a str,
}

/// Why one attempt failed, which decides what the next attempt does.
enum Failure {
    /// The connection broke after making progress: resume from the partial.
    Interrupted(HubError),
    /// The partial file is unusable (stale, corrupt): delete it, start over.
    Restart(HubError),
    /// Retrying cannot help.
    Fatal(HubError),
}

/// Downloads `d.url` to `d.dest`, resuming any partial file, and returns the
/// content's sha256. On a hash or size mismatch nothing is left behind.
pub(crate) fn download(agent: &Agent, d: &Download<'_>, progress: bool) -> Result<String> {
    let part = with_suffix(d.dest, "part");
    let bar = progress_bar(progress, d.label);
    let started = std::time::Instant::now();
    let mut resumes = 0;
    let mut restarted = false;
    loop {
        match attempt(agent, d, &part, &bar) {
            Ok(sha) => {
                // A one-line summary reads better in scrollback than a frozen bar.
                bar.finish_and_clear();
                if progress {
                    let bytes = fs::metadata(d.dest).map(|m| m.len()).unwrap_or(0);
                    eprintln!(
                        "downloaded {} ({:.1} MiB) in {:.1?}",
                        d.label,
                        bytes as f64 / (1024.0 * 1024.0),
                        started.elapsed()
                    );
                }
                return Ok(sha);
            }
            Err(Failure::Interrupted(e)) if resumes < MAX_RESUMES => {
                resumes += 1;
                tracing::warn!("{e}; resuming (attempt {})", resumes + 1);
                std::thread::sleep(Duration::from_millis(200 * u64::from(resumes)));
            }
            Err(Failure::Restart(e)) if !restarted => {
                restarted = true;
                tracing::warn!("{e}; discarding the partial download and starting over");
                remove_if_exists(&part)?;
            }
            Err(Failure::Interrupted(e) | Failure::Restart(e) | Failure::Fatal(e)) => {
                bar.abandon();
                return Err(e);
            }
        }
    }
}

fn progress_bar(progress: bool, label: &str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    // The template is a constant; falling back to the default style if it
    // were ever rejected is better than failing a download over cosmetics.
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(label.to_string());
    bar
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(HubError::io("removing", path, e)),
    }
}

fn attempt(
    agent: &Agent,
    d: &Download<'_>,
    part: &Path,
    bar: &ProgressBar,
) -> Result<String, Failure> {
    let fatal = Failure::Fatal;
    let mut offset = match fs::metadata(part) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
        Err(e) => return Err(fatal(HubError::io("reading metadata of", part, e))),
    };
    if d.size.is_some_and(|size| offset > size) {
        // Longer than the whole file: not a prefix of it.
        offset = 0;
    }
    let resumed = offset > 0;
    let mut hasher = Sha256::new();
    let mut etag_sha = None;

    if resumed && d.size == Some(offset) {
        // A previous run got every byte but stopped before verifying.
        let mut file = File::open(part).map_err(|e| fatal(HubError::io("opening", part, e)))?;
        hash_reader(&mut file, &mut hasher, offset)
            .map_err(|e| fatal(HubError::io("reading", part, e)))?;
    } else {
        let mut req = agent
            .get(d.url)
            // Byte ranges must refer to the file itself, not a gzip of it.
            .header("Accept-Encoding", "identity");
        if let Some(token) = d.bearer {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        if offset > 0 {
            req = req.header("Range", format!("bytes={offset}-"));
        }
        let resp = req.call().map_err(|e| fatal(HubError::http(d.url, e)))?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        match status {
            206 if offset > 0 => {
                let start = header("content-range")
                    .as_deref()
                    .and_then(content_range_start);
                if start != Some(offset) {
                    return Err(Failure::Restart(HubError::http(
                        d.url,
                        format!("asked for bytes from {offset}, got Content-Range {start:?}"),
                    )));
                }
            }
            200 => {
                if offset > 0 {
                    tracing::info!(
                        "{} ignored the Range request; downloading from the start",
                        d.url
                    );
                }
                offset = 0;
            }
            416 if offset > 0 => {
                // The partial is not a prefix the server can continue.
                return Err(Failure::Restart(HubError::HttpStatus {
                    url: d.url.to_string(),
                    status,
                }));
            }
            _ => {
                return Err(fatal(HubError::HttpStatus {
                    url: d.url.to_string(),
                    status,
                }));
            }
        }
        if d.sha256.is_none() && d.sha_from_etag {
            etag_sha = ["x-linked-etag", "etag"]
                .iter()
                .filter_map(|h| header(h))
                .map(|v| {
                    v.trim_start_matches("W/")
                        .trim_matches('"')
                        .to_ascii_lowercase()
                })
                .find(|v| is_sha256_hex(v));
        }
        let total = header("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|len| offset + len);
        if let (Some(expected), Some(actual)) = (d.size, total)
            && expected != actual
        {
            // Caught before downloading a wrong file in full.
            return Err(fatal(HubError::SizeMismatch {
                what: d.url.to_string(),
                expected,
                actual,
            }));
        }

        let mut file = open_part(part, offset, &mut hasher).map_err(fatal)?;
        bar.set_length(total.or(d.size).unwrap_or(0));
        bar.set_position(offset);

        let mut reader = resp.into_body().into_reader();
        let mut buf = vec![0u8; 256 * 1024];
        let mut received = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Keep what arrived: it is the prefix the next attempt resumes.
                    let _ = file.flush();
                    let err = HubError::http(d.url, e);
                    return Err(if received > 0 {
                        Failure::Interrupted(err)
                    } else {
                        fatal(err)
                    });
                }
            };
            file.write_all(&buf[..n])
                .map_err(|e| fatal(HubError::io("writing", part, e)))?;
            hasher.update(&buf[..n]);
            received += n as u64;
            bar.inc(n as u64);
        }
        file.sync_all()
            .map_err(|e| fatal(HubError::io("syncing", part, e)))?;
        drop(file);

        let got = offset + received;
        if let Some(expected) = total.or(d.size)
            && got != expected
        {
            if got < expected && received > 0 {
                return Err(Failure::Interrupted(HubError::http(
                    d.url,
                    format!("connection closed after {got} of {expected} bytes"),
                )));
            }
            remove_if_exists(part).map_err(fatal)?;
            return Err(fatal(HubError::SizeMismatch {
                what: d.url.to_string(),
                expected,
                actual: got,
            }));
        }
    }

    let actual = hex::encode(hasher.finalize());
    let expected = d.sha256.map(str::to_ascii_lowercase).or(etag_sha);
    if let Some(expected) = expected
        && expected != actual
    {
        // Never keep bytes that failed verification, not even as a partial.
        remove_if_exists(part).map_err(fatal)?;
        let err = HubError::ShaMismatch {
            what: d.url.to_string(),
            expected,
            actual,
        };
        // A resumed file may have been corrupted by whatever wrote its prefix;
        // one clean retry tells that apart from a wrong file on the server.
        return Err(if resumed {
            Failure::Restart(err)
        } else {
            fatal(err)
        });
    }
    fs::rename(part, d.dest).map_err(|e| fatal(HubError::io("renaming", part, e)))?;
    Ok(actual)
}

/// Opens the partial file for writing at `offset`, feeding its existing
/// `offset` bytes to `hasher` first so the final hash covers the whole file
/// without a second pass.
fn open_part(part: &Path, offset: u64, hasher: &mut Sha256) -> Result<File> {
    if offset == 0 {
        return File::create(part).map_err(|e| HubError::io("creating", part, e));
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(part)
        .map_err(|e| HubError::io("opening", part, e))?;
    let hashed =
        hash_reader(&mut file, hasher, offset).map_err(|e| HubError::io("reading", part, e))?;
    if hashed != offset {
        return Err(HubError::io(
            "reading",
            part,
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "partial file shrank while resuming",
            ),
        ));
    }
    file.set_len(offset)
        .and_then(|()| file.seek(SeekFrom::Start(offset)))
        .map_err(|e| HubError::io("seeking in", part, e))?;
    Ok(file)
}

/// First byte position of a `Content-Range: bytes <start>-<end>/<total>` header.
fn content_range_start(value: &str) -> Option<u64> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    let (start, _) = rest.split_once('-')?;
    start.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_range() {
        assert_eq!(content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(content_range_start("bytes 0-0/*"), Some(0));
        assert_eq!(content_range_start("bytes */200"), None);
        assert_eq!(content_range_start("items 1-2/3"), None);
    }
}
