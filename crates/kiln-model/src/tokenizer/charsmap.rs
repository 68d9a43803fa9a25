//! Checks a SentencePiece `precompiled_charsmap` before `tokenizers` uses it. The charsmap is a
//! double-array trie (darts-clone units) over replacement strings; `tokenizers`' normalizer
//! indexes both without bounds checks, so a hostile file could make every later encode panic.
//! This walks every unit once and refuses a map in which any lookup could leave the arrays.

use crate::ModelError;

fn bad(reason: impl Into<String>) -> ModelError {
    ModelError::Tokenizer(format!(
        "tokenizer.ggml.precompiled_charsmap: {}",
        reason.into()
    ))
}

fn offset(unit: u32) -> usize {
    let unit = unit as usize;
    (unit >> 10) << ((unit & (1 << 9)) >> 6)
}

fn has_leaf(unit: u32) -> bool {
    (unit >> 8) & 1 == 1
}

fn label(unit: u32) -> usize {
    (unit as usize) & ((1 << 31) | 0xFF)
}

fn value(unit: u32) -> usize {
    (unit as usize) & ((1 << 31) - 1)
}

/// Refuses a charsmap whose trie lookups could index outside it: the trie must be whole
/// little-endian units, every reachable unit's children (its offset's 256-entry block) inside
/// the trie, every reachable leaf's string start inside the UTF-8 replacement strings on a
/// character boundary. Units no lookup reaches may hold anything (real maps keep values there).
pub(super) fn check(map: &[u8]) -> Result<(), ModelError> {
    let (size, rest) = map
        .split_first_chunk::<4>()
        .ok_or_else(|| bad("shorter than its trie size"))?;
    let trie_bytes = u32::from_le_bytes(*size) as usize;
    if trie_bytes == 0 || !trie_bytes.is_multiple_of(4) || trie_bytes > rest.len() {
        return Err(bad(format!(
            "a trie of {trie_bytes} bytes in {} bytes",
            rest.len()
        )));
    }
    let (trie, strings) = rest.split_at(trie_bytes);
    let strings = std::str::from_utf8(strings).map_err(|_| bad("strings are not UTF-8"))?;
    let units: Vec<u32> = trie
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    // The nodes a lookup can reach, walked as `common_prefix_search` walks them: from a node,
    // input byte `c` (1..=255) probes unit `child ^ c` and moves there when its label is `c`.
    let mut seen = vec![false; units.len()];
    let mut todo = vec![0usize];
    seen[0] = true;
    while let Some(p) = todo.pop() {
        let child = p ^ offset(units[p]);
        if (child | 0xFF) >= units.len() {
            return Err(bad(format!("unit {p} points outside the trie")));
        }
        if p != 0 && has_leaf(units[p]) {
            let start = value(units[child]);
            if start >= strings.len() || !strings.is_char_boundary(start) {
                return Err(bad(format!("unit {p} names string offset {start}")));
            }
        }
        for c in 1..=255usize {
            let next = child ^ c;
            if label(units[next]) == c && !seen[next] {
                seen[next] = true;
                todo.push(next);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    fn map(units: &[u32], strings: &[u8]) -> Vec<u8> {
        let mut out = ((units.len() * 4) as u32).to_le_bytes().to_vec();
        units.iter().for_each(|u| out.extend(u.to_le_bytes()));
        out.extend(strings);
        out
    }

    #[test]
    fn refuses_maps_that_would_index_outside() {
        assert!(check(&[]).is_err());
        assert!(check(&map(&[], b"a\0")).is_err(), "empty trie");
        assert!(check(&map(&[0; 256], b"a\0")).is_ok());
        let mut far = vec![0u32; 256];
        far[0] = 300 << 10; // the root's children lie past the trie
        assert!(check(&map(&far, b"a\0")).is_err());
        // Byte 'a' reaches unit 0x61 (label 0x61), a leaf whose value unit (0x61 ^ 0 = itself)
        // names string offset 0x161: outside two bytes of strings.
        let mut leaf = vec![0u32; 256];
        leaf[0x61] = 0x61 | (1 << 8);
        assert!(check(&map(&leaf, b"a\0")).is_err());
        leaf[0x61] = 0x61;
        assert!(check(&map(&leaf, b"a\0")).is_ok(), "no leaf, nothing named");
        let mut garbage = vec![0u32; 256];
        garbage[7] = u32::MAX; // unreachable: its label is not 7
        assert!(check(&map(&garbage, b"a\0")).is_ok());
        let mut truncated = map(&[0; 256], b"a\0");
        truncated.truncate(100);
        assert!(check(&truncated).is_err());
        assert!(check(&map(&[0; 256], &[0xff, 0])).is_err(), "not UTF-8");
    }
}
