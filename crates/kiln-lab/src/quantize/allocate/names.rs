//! Which layers optiq protects and how it reads block indices from names.

use super::*;

// ---------------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------------

/// Which layers get the ×100 bonus (optiq `_identify_output_layers`,
/// `_identify_moe_protected_layers`, `_identify_boundary_layers`).
pub(super) fn protected_layers(
    names: &[&str],
    protect_first_last: bool,
    n_protect: usize,
) -> Vec<bool> {
    let boundary = if protect_first_last {
        boundary_layers(names, n_protect)
    } else {
        vec![false; names.len()]
    };
    names
        .iter()
        .zip(boundary)
        .map(|(n, b)| b || is_output_layer(n) || is_moe_protected(n))
        .collect()
}

/// Output layers: a keyword inside the last segment or equal to one of the last two
/// (lower-cased), or a name with no `layers` segment at all.
pub(super) fn is_output_layer(name: &str) -> bool {
    let lower = name.to_lowercase();
    let parts: Vec<&str> = lower.split('.').collect();
    let last = parts[parts.len() - 1];
    let last_two = &parts[parts.len().saturating_sub(2)..];
    OUTPUT_KEYWORDS
        .iter()
        .any(|kw| last.contains(kw) || last_two.contains(kw))
        || !name.split('.').any(|p| p == "layers")
}

/// MoE routers (`….mlp.gate`, `….router`, `….router.proj`) and shared experts.
pub(super) fn is_moe_protected(name: &str) -> bool {
    let mut rev = name.rsplit('.');
    let last = rev.next().unwrap_or_default();
    let prev = rev.next().unwrap_or_default();
    (last == "gate" && prev == "mlp")
        || last == "router"
        || (last == "proj" && prev == "router")
        || name.contains(".shared_experts.")
        || name.contains(".shared_expert.")
}

/// The layers of the first and last `n_protect` block indices that occur in `names`.
pub(super) fn boundary_layers(names: &[&str], n_protect: usize) -> Vec<bool> {
    let per_name: Vec<Vec<i128>> = names.iter().map(|n| layer_segment_indices(n)).collect();
    let sorted: Vec<i128> = per_name
        .iter()
        .flatten()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // Python's `sorted[:k]` and `sorted[-k:]` (k ≥ 1 here) clamp to the list.
    let k = n_protect.min(sorted.len());
    let ends: BTreeSet<i128> = sorted[..k]
        .iter()
        .chain(&sorted[sorted.len() - k..])
        .copied()
        .collect();
    per_name
        .iter()
        .map(|idx| idx.iter().any(|i| ends.contains(i)))
        .collect()
}

/// Every `layers.<int>` index of a name, where `<int>` is whatever Python's `int()` accepts.
pub(super) fn layer_segment_indices(name: &str) -> Vec<i128> {
    let parts: Vec<&str> = name.split('.').collect();
    parts
        .windows(2)
        .filter(|w| w[0] == "layers")
        .filter_map(|w| python_int(w[1]))
        .collect()
}

/// Python's `int(s)` for a decimal string: surrounding whitespace, one sign, digits with single
/// underscores between them. Non-ASCII digits are not accepted (Python's are).
pub(super) fn python_int(s: &str) -> Option<i128> {
    // Python maps non-ASCII whitespace to ' ' before parsing; ASCII whitespace is C's isspace.
    let mapped: String = s
        .chars()
        .map(|c| {
            if !c.is_ascii() && c.is_whitespace() {
                ' '
            } else {
                c
            }
        })
        .collect();
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r');
    let t = mapped.trim_matches(is_space);
    let (negative, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let well_formed = !body.is_empty()
        && body
            .split('_')
            .all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()));
    if !well_formed {
        return None;
    }
    let digits: String = body.chars().filter(|&c| c != '_').collect();
    let magnitude: i128 = digits.parse().ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

/// The transformer block of a layer: Python's `re.search(r"layers\.(\d+)", name)` (the first
/// `layers.` followed by digits, anywhere in the name).
pub(super) fn block_index(name: &str) -> Option<i128> {
    let digits = name.match_indices("layers.").find_map(|(at, pat)| {
        let rest = &name[at + pat.len()..];
        let n = rest.bytes().take_while(u8::is_ascii_digit).count();
        (n > 0).then(|| &rest[..n])
    })?;
    digits.parse().ok()
}

/// Whether the last path segment names an attention projection.
pub(super) fn is_attention_component(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or_default();
    ATTENTION_TOKENS.contains(&last)
}
