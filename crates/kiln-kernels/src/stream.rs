//! Whether one-token matmuls stream their weights past the caches. Decode reads every weight
//! once per token. When the weights are larger than the last-level cache, none of them is
//! still cached at the next token, and an ordinary prefetch into every level only evicts what
//! is reused (the activations, the KV cache, the code); on AMD's L3, which is filled with the
//! lines L2 evicts, it also writes every weight line into the L3 on its way out. A
//! non-temporal prefetch (`prefetchnta`) brings the line to L1 alone. When the weights fit the
//! cache, ordinary prefetches keep them there from one token to the next.

use std::sync::OnceLock;

/// Assumed last-level cache when the system does not say.
const DEFAULT_LAST_LEVEL_CACHE: usize = 32 << 20;

/// Whether the live weights ([`crate::arena::live_weight_bytes`]) exceed the last-level
/// cache, so that the one-token kernels prefetch them non-temporally.
pub fn weights_exceed_cache() -> bool {
    crate::arena::live_weight_bytes() > last_level_cache_bytes()
}

/// Size of the largest cache level of CPU 0, as the system reports it (Linux sysfs); 32 MiB
/// where it reports none.
pub fn last_level_cache_bytes() -> usize {
    static LLC: OnceLock<usize> = OnceLock::new();
    *LLC.get_or_init(|| detect().unwrap_or(DEFAULT_LAST_LEVEL_CACHE))
}

/// The size of the highest-level data or unified cache in CPU 0's sysfs cache entries.
fn detect() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let read = |p: &std::path::Path, f: &str| std::fs::read_to_string(p.join(f)).ok();
    dir.filter_map(|e| {
        let p = e.ok()?.path();
        let level: u32 = read(&p, "level")?.trim().parse().ok()?;
        let kind = read(&p, "type")?;
        let size = parse_cache_size(&read(&p, "size")?)?;
        (kind.trim() != "Instruction").then_some((level, size))
    })
    .max()
    .map(|(_, size)| size)
}

/// A sysfs cache size: a number of bytes with an optional `K`, `M` or `G` suffix
/// (binary units, as the kernel writes them).
fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 10),
        b'M' => (&s[..s.len() - 1], 20),
        b'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: usize = digits.parse().ok()?;
    n.checked_mul(1 << shift).filter(|&b| b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::WeightBuf;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("16384K\n"), Some(16 << 20));
        assert_eq!(parse_cache_size("32M"), Some(32 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("512"), Some(512));
        for bad in ["", "K", "0K", "-1K", "12Q", "99999999999999999999G", "1.5M"] {
            assert_eq!(parse_cache_size(bad), None, "{bad:?}");
        }
        assert!(last_level_cache_bytes() > 0);
    }

    #[test]
    fn weights_larger_than_the_cache_are_streamed() {
        // Other tests hold weights too, so only the direction can be asserted.
        let big = WeightBuf::zeroed_dedicated(last_level_cache_bytes() + 1);
        assert!(weights_exceed_cache());
        drop(big);
    }
}
