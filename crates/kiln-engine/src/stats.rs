//! Timing and memory figures of one generation.

use serde::Serialize;

/// What one generation cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GenerationStats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was reused from the previous request.
    pub cached_tokens: usize,
    /// Tokens generated (EOS excluded).
    pub generated_tokens: usize,
    /// Seconds spent on prefill.
    pub prefill_secs: f64,
    /// Seconds spent decoding after the first token.
    pub decode_secs: f64,
    /// Seconds from the start of the request to the first sampled token.
    pub time_to_first_token_secs: f64,
    /// Prefill throughput (prompt tokens actually computed per second).
    pub prompt_tokens_per_sec: f64,
    /// Decode throughput (tokens per second after the first).
    pub decode_tokens_per_sec: f64,
    /// Seconds spent following the output constraint (masks and grammar steps; 0 without one).
    pub grammar_secs: f64,
    /// Peak resident memory of the process so far, in bytes (Linux `VmHWM`; 0 elsewhere).
    pub peak_rss_bytes: u64,
}

/// Peak resident set size of this process in bytes, from `/proc/self/status`.
pub fn peak_rss_bytes() -> u64 {
    proc_status_kib("VmHWM:").map_or(0, |k| k * 1024)
}

/// Restarts the peak-RSS count from the current resident size (Linux `clear_refs` 5), so a
/// later [`peak_rss_bytes`] measures generation rather than loading, whose file mapping peaks
/// higher. Returns false where the kernel does not allow it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Current resident set size of this process in bytes.
pub fn current_rss_bytes() -> u64 {
    proc_status_kib("VmRSS:").map_or(0, |k| k * 1024)
}

fn proc_status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

pub(crate) fn per_sec(n: usize, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}
