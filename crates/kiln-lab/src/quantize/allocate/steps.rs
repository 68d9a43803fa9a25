//! The allocator's steps after validation: KL clean-up and boost, the block-aware floor,
//! the greedy heap and the run guard, and the summary.

use super::*;

// ---------------------------------------------------------------------------------------------
// Sensitivities
// ---------------------------------------------------------------------------------------------

/// A layer's KL at `bits`; a width that was not measured counts as 0 (`dict.get(b, 0)`).
pub(super) fn kl_at(kl: &BTreeMap<u32, f64>, bits: u32) -> f64 {
    kl.get(&bits).copied().unwrap_or(0.0)
}

/// optiq's NaN rule: in a layer with any NaN, each NaN at width `b` becomes
/// `maxFinite·10·(maxBits/max(b,1))`, `maxFinite` being the layer's largest non-NaN KL
/// (1e6 when there is none) — a strong upgrade signal at low widths.
pub(super) fn clean_nan(kl: &BTreeMap<u32, f64>, max_bits: u32) -> BTreeMap<u32, f64> {
    if !kl.values().any(|v| v.is_nan()) {
        return kl.clone();
    }
    // Python's max() keeps the first of equal maxima; only ±0 could tell, and no decision
    // depends on the sign of a zero KL.
    let max_finite = kl
        .values()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(None, |m: Option<f64>, v| match m {
            Some(m) if v <= m => Some(m),
            _ => Some(v),
        })
        .unwrap_or(NAN_FALLBACK);
    kl.iter()
        .map(|(&b, &v)| {
            let ratio = f64::from(max_bits) / f64::from(b.max(1));
            (
                b,
                if v.is_nan() {
                    max_finite * 10.0 * ratio
                } else {
                    v
                },
            )
        })
        .collect()
}

/// The KLs the greedy orders by: ×100 for protected layers.
pub(super) fn boost_protected(
    cleaned: &[BTreeMap<u32, f64>],
    protected: &[bool],
) -> Vec<BTreeMap<u32, f64>> {
    cleaned
        .iter()
        .zip(protected)
        .map(|(kl, &p)| {
            if p {
                kl.iter().map(|(&b, &v)| (b, v * PROTECTED_BOOST)).collect()
            } else {
                kl.clone()
            }
        })
        .collect()
}

/// The benefit of `cur → next` bits (optiq `_kl_reduction`). Under a bf16 reference KL falls
/// as bits rise; under a uniform-N reference the KL at N is ~0 and a higher width's KL *is*
/// the benefit, recognised by `kl[next] > kl[cur]`.
pub(super) fn kl_reduction(kl: &BTreeMap<u32, f64>, cur: u32, next: u32) -> f64 {
    let (kc, kn) = (kl_at(kl, cur), kl_at(kl, next));
    if next > cur && kn > kc {
        kn - kc
    } else {
        kc - kn
    }
}

// ---------------------------------------------------------------------------------------------
// Block-aware floor
// ---------------------------------------------------------------------------------------------

/// Lifts each block's most sensitive layers (by raw KL at the lowest width, attention
/// reserved first) from the lowest to the second-lowest width (optiq `_apply_block_aware_floor`).
pub(super) fn apply_block_floor(
    alloc: &mut [u32],
    names: &[&str],
    blocks: &[Option<i128>],
    raw: &[&BTreeMap<u32, f64>],
    (lowest, second): (u32, u32),
    n_floor: usize,
) {
    for mut members in group_by_block(blocks).into_values() {
        // `layers.sort(key=lambda x: -x[0])`, NaN keys included.
        let key = |i: &usize| -kl_at(raw[*i], lowest);
        py_sort::sort(&mut members, &|a, b| key(a) < key(b));
        for i in floor_picks(&members, names, n_floor) {
            if alloc[i] < second {
                alloc[i] = second;
            }
        }
    }
}

/// The layer indices of each block, in input order.
pub(super) fn group_by_block(blocks: &[Option<i128>]) -> BTreeMap<i128, Vec<usize>> {
    let mut groups: BTreeMap<i128, Vec<usize>> = BTreeMap::new();
    for (i, b) in blocks.iter().enumerate() {
        if let Some(b) = b {
            groups.entry(*b).or_default().push(i);
        }
    }
    groups
}

/// Which of a block's layers (sorted most sensitive first) the floor lifts: up to two
/// attention projections reserved (one unless the block has full q/k/v/o attention), then
/// the most sensitive others; a block without full attention gets at most one.
pub(super) fn floor_picks(sorted: &[usize], names: &[&str], n_floor: usize) -> Vec<usize> {
    let attn: Vec<usize> = sorted
        .iter()
        .copied()
        .filter(|&i| is_attention_component(names[i]))
        .collect();
    let full_attention = attn.len() >= 4;
    let reserve = match attn.len() {
        0 => 0,
        1..=3 => 1,
        _ => 2,
    }
    .min(n_floor);
    let block_floor = if full_attention {
        n_floor
    } else {
        n_floor.min(1)
    };
    let mut picks: Vec<usize> = attn[..reserve].to_vec();
    for &i in sorted {
        if picks.len() >= block_floor {
            break;
        }
        if !picks.contains(&i) {
            picks.push(i);
        }
    }
    picks
}

// ---------------------------------------------------------------------------------------------
// Greedy
// ---------------------------------------------------------------------------------------------

/// A heap entry: optiq's tuple `(-eff, name, old, new, klred)`, the name by layer index.
#[derive(Debug, Clone, Copy)]
pub(super) struct Upgrade {
    pub(super) neg_eff: f64,
    pub(super) layer: usize,
    pub(super) old: u32,
    pub(super) new: u32,
    pub(super) klred: f64,
}

/// Python's `<` on two such tuples: decided by the first items that are not `==` (a NaN is
/// never `==`: optiq computes each one afresh, so Python's identity shortcut never applies).
pub(super) fn upgrade_lt(a: &Upgrade, b: &Upgrade, names: &[&str]) -> bool {
    if a.neg_eff != b.neg_eff {
        return a.neg_eff < b.neg_eff;
    }
    let (na, nb) = (names[a.layer], names[b.layer]);
    // Rust compares str bytewise; UTF-8 byte order is code-point order, which Python uses.
    if na != nb {
        return na < nb;
    }
    if a.old != b.old {
        return a.old < b.old;
    }
    if a.new != b.new {
        return a.new < b.new;
    }
    a.klred != b.klred && a.klred < b.klred
}

/// The most efficient upgrade first, until the average reaches `target` or nothing is left.
pub(super) fn greedy(
    alloc: &mut [u32],
    names: &[&str],
    params: &[u64],
    kl: &[BTreeMap<u32, f64>],
    bits: &[u32],
    target: f64,
) {
    let lt = |a: &Upgrade, b: &Upgrade| upgrade_lt(a, b, names);
    let mut heap = py_heap::Heap::default();
    for i in 0..alloc.len() {
        if let Some(u) = next_upgrade(i, alloc[i], &kl[i], params[i], bits) {
            heap.push(u, &lt);
        }
    }
    let total_params: u128 = params.iter().map(|&p| u128::from(p)).sum();
    let mut total_bits: u128 = alloc
        .iter()
        .zip(params)
        .map(|(&b, &p)| u128::from(b) * u128::from(p))
        .sum();
    while bpw(total_bits, total_params) < target {
        let Some(u) = heap.pop(&lt) else { break };
        if alloc[u.layer] != u.old {
            continue; // stale (cannot happen with one live entry per layer, kept as in optiq)
        }
        let p = u128::from(params[u.layer]);
        total_bits = total_bits - u128::from(u.old) * p + u128::from(u.new) * p;
        alloc[u.layer] = u.new;
        if let Some(next) = next_upgrade(u.layer, u.new, &kl[u.layer], params[u.layer], bits) {
            heap.push(next, &lt);
        }
    }
}

/// The step to the next candidate width, unless at the top or it brings no KL reduction
/// (optiq `_push_next_upgrade`; a NaN reduction is not `<= 0`, so it is kept).
pub(super) fn next_upgrade(
    layer: usize,
    cur: u32,
    kl: &BTreeMap<u32, f64>,
    params: u64,
    bits: &[u32],
) -> Option<Upgrade> {
    let pos = bits.iter().position(|&b| b == cur)?;
    let new = *bits.get(pos + 1)?;
    let klred = kl_reduction(kl, cur, new);
    if klred <= 0.0 {
        return None;
    }
    let cost = u128::from(new - cur) * u128::from(params);
    let eff = klred / cost.max(1) as f64;
    Some(Upgrade {
        neg_eff: -eff,
        layer,
        old: cur,
        new,
        klred,
    })
}

/// Σ bits·params / Σ params as Python's `int / int` (exact: both sides are below 2^53).
pub(super) fn bpw(total_bits: u128, total_params: u128) -> f64 {
    total_bits as f64 / total_params.max(1) as f64
}

// ---------------------------------------------------------------------------------------------
// Run guard
// ---------------------------------------------------------------------------------------------

/// For every run of more than `max_run` consecutive (in sorted index order) blocks with over
/// half their layers at the lowest width, lifts the most sensitive lowest-width layer of every
/// `max_run`-th block of the run (optiq `_enforce_block_run_limit`).
pub(super) fn enforce_run_limit(
    alloc: &mut [u32],
    blocks: &[Option<i128>],
    cleaned: &[BTreeMap<u32, f64>],
    lowest: u32,
    second: u32,
    max_run: usize,
) {
    let groups: Vec<Vec<usize>> = group_by_block(blocks).into_values().collect();
    let low_dominated: Vec<bool> = groups
        .iter()
        .map(|m| {
            let low = m.iter().filter(|&&i| alloc[i] == lowest).count();
            // `(low / max(len, 1)) > 0.5`, with Python's correctly rounded int division.
            low as f64 / m.len().max(1) as f64 > 0.5
        })
        .collect();
    for (start, end) in long_runs(&low_dominated, max_run) {
        for members in groups[start..end].iter().step_by(max_run.max(1)) {
            let mut candidates: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&i| alloc[i] == lowest)
                .collect();
            let key = |i: &usize| -kl_at(&cleaned[*i], lowest);
            py_sort::sort(&mut candidates, &|a, b| key(a) < key(b));
            if let Some(&i) = candidates.first() {
                alloc[i] = second;
            }
        }
    }
}

/// The `[start, end)` runs of `true` longer than `max_run`.
pub(super) fn long_runs(flags: &[bool], max_run: usize) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, &f) in flags.iter().enumerate() {
        if f && start.is_none() {
            start = Some(i);
        }
        if !f || i == flags.len() - 1 {
            let end = if f { i + 1 } else { i };
            if let Some(s) = start.filter(|&s| end - s > max_run) {
                runs.push((s, end));
            }
            start = None;
        }
    }
    runs
}

// ---------------------------------------------------------------------------------------------
// Result
// ---------------------------------------------------------------------------------------------

/// The answer, with optiq's counts and size estimate.
pub(super) fn summarize(names: &[&str], params: &[u64], alloc: &[u32], bits: &[u32]) -> Allocation {
    let total_params: u128 = params.iter().map(|&p| u128::from(p)).sum();
    let total_bits: u128 = alloc
        .iter()
        .zip(params)
        .map(|(&b, &p)| u128::from(b) * u128::from(p))
        .sum();
    let (min_bits, max_bits) = (bits[0], bits[bits.len() - 1]);
    Allocation {
        bits: names
            .iter()
            .map(|n| n.to_string())
            .zip(alloc.iter().copied())
            .collect(),
        achieved_bpw: bpw(total_bits, total_params),
        n_high: alloc.iter().filter(|&&b| b == max_bits).count(),
        n_low: alloc.iter().filter(|&&b| b == min_bits).count(),
        // `total / 8 / (1024 * 1024)`: both divisions by powers of two, so exact.
        estimated_mb: total_bits as f64 / 8.0 / (1024.0 * 1024.0),
    }
}
