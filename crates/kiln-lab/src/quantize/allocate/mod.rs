//! The mixed-precision bit allocator: which bit width each quantizable layer gets, from its
//! measured sensitivity, for a target average bits per weight (spec §7.2 item 4).
//!
//! This is an exact port of `optimize_mixed_precision` from mlx-optiq 0.7.7 — the file
//! `optiq/core/optimizer.py` of the PyPI wheel, which is also what mlx-bun's
//! `src/quantize/allocator.ts` ports. `crates/kiln-lab/tests/data/allocate_oracle.py` runs that
//! Python on the test tables and the tests replay its output bit for bit.
//!
//! The steps, in optiq's order:
//! 1. candidate bits: the given list sorted, else the union of the measured bit widths, else
//!    `[4, 8]`;
//! 2. protected layers (output and embedding layers, anything outside `layers.N`, MoE routers
//!    and shared experts, the first and last `n_protect` blocks) get their KL ×100 — for the
//!    greedy's ordering only;
//! 3. every layer starts at the lowest bits; the block-aware floor lifts the most sensitive
//!    layers of every block (attention first) to the second-lowest;
//! 4. NaN KLs are replaced by large values (after the floor, which sees the raw NaNs — as in
//!    optiq);
//! 5. a greedy loop takes the upgrade with the most KL reduction per added bit until the
//!    average reaches the target (a floor, not a cap) or nothing is left to upgrade;
//! 6. the run guard lifts one layer in every `max_low_bit_run`-th block of a long run of
//!    blocks sitting mostly at the lowest bits.
//!
//! Exactness. Python's orderings are reproduced, not approximated: the two sorts are a
//! transcription of CPython 3.11's `list.sort` (timsort with the powersort merge policy) and
//! the heap one of `heapq`, both driven by Python's `<` on floats and tuples. With ordinary
//! numbers any stable sort and any heap would agree; the transcriptions matter only where
//! Python's comparisons are inconsistent, which optiq lets happen: raw NaN KLs reach the
//! floor's sort, and an infinite KL at two adjacent widths makes a NaN efficiency in the heap.
//! Bit sums are integers (as Python's are), and divided once, so the averages are Python's
//! correctly rounded quotients.
//!
//! Where kiln deliberately differs, it refuses the input instead of guessing
//! ([`LabError::Config`]): a target outside [1, 16], an explicit empty, duplicated or
//! out-of-range candidate list (optiq silently falls back to `[4, 8]` for an empty one and
//! stalls on duplicates), duplicate or empty layer names, a layer with no parameters,
//! `n_protect == 0` with `protect_first_last` (Python's `indices[-0:]` would protect every
//! block), and models too large for exact `f64` accounting. Two name-parsing corners are
//! ASCII-only: Python's `int()` and `\d` also accept non-ASCII decimal digits, and an index
//! that does not fit an `i128` is treated as absent here (Python would parse it).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::LabError;

/// One quantizable layer's measured sensitivity.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSensitivity {
    /// The module path, e.g. `model.layers.3.self_attn.q_proj`.
    pub name: String,
    /// The logical (unpacked) parameter count.
    pub param_count: u64,
    /// Bits → KL(reference ‖ this layer quantized at those bits). A width missing here counts
    /// as KL 0, as in optiq.
    pub kl: BTreeMap<u32, f64>,
}

/// The allocator's knobs (optiq's `optimize_mixed_precision` arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorOptions {
    /// The average bits per weight to reach: a floor, overshot by the discrete grid.
    pub target_bpw: f64,
    /// The bit widths to choose from; `None` uses every width measured in the table.
    pub candidate_bits: Option<Vec<u32>>,
    /// Whether the first and last `n_protect` blocks get the ×100 ordering bonus.
    pub protect_first_last: bool,
    /// How many blocks at each end are protected.
    pub n_protect: usize,
    /// How many of each block's most sensitive layers start at the second-lowest width
    /// (0 turns the floor off).
    pub n_floor_per_block: usize,
    /// The longest run of mostly-lowest-width blocks left alone (0 turns the guard off).
    pub max_low_bit_run: usize,
}

impl Default for AllocatorOptions {
    /// optiq's function defaults (its CLI passes its own target).
    fn default() -> Self {
        AllocatorOptions {
            target_bpw: 4.0,
            candidate_bits: None,
            protect_first_last: true,
            n_protect: 1,
            n_floor_per_block: 2,
            max_low_bit_run: 3,
        }
    }
}

/// The allocator's answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Allocation {
    /// `(layer name, bits)` in the input order.
    pub bits: Vec<(String, u32)>,
    /// Σ bits·params / Σ params (no scale/bias overhead, as in optiq).
    pub achieved_bpw: f64,
    /// How many layers got the highest candidate width.
    pub n_high: usize,
    /// How many layers got the lowest candidate width.
    pub n_low: usize,
    /// Σ bits·params / 8 in MiB (optiq's `estimated_size_mb`; no scales or biases).
    pub estimated_mb: f64,
}

/// The widest accepted width: 16 is optiq's "keep bf16" tier.
const MAX_BITS: u32 = 16;

/// Σ bits·params must stay below this for the averages to be exact in `f64`.
const EXACT_LIMIT: u128 = 1 << 53;

/// The ordering bonus of protected layers.
const PROTECTED_BOOST: f64 = 100.0;

/// The stand-in for "largest finite KL" of a layer whose every KL is NaN.
const NAN_FALLBACK: f64 = 1e6;

/// The last path segments that mark an attention projection (optiq `_ATTENTION_TOKENS`).
const ATTENTION_TOKENS: [&str; 13] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "in_proj_qkv",
    "in_proj_a",
    "in_proj_b",
    "in_proj_z",
    "out_proj",
    "qkv_proj",
    "wqkv",
    "Wqkv",
    "attn_qkv",
];

/// Keywords of output/embedding layers (optiq `_identify_output_layers`).
const OUTPUT_KEYWORDS: [&str; 7] = [
    "lm_head",
    "embed_tokens",
    "wte",
    "wpe",
    "output_proj",
    "embed_out",
    "head",
];

/// Chooses every layer's bits for `opts.target_bpw`; see the module doc for the algorithm.
pub fn allocate(
    layers: &[LayerSensitivity],
    opts: &AllocatorOptions,
) -> Result<Allocation, LabError> {
    validate_options(opts)?;
    validate_layers(layers)?;
    if layers.is_empty() {
        return Ok(Allocation::default());
    }
    let bits = candidate_bits(layers, opts)?;
    let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
    let blocks: Vec<Option<i128>> = names.iter().map(|n| block_index(n)).collect();
    let lowest = bits[0];
    let mut alloc = vec![lowest; layers.len()];
    if opts.n_floor_per_block > 0 && bits.len() >= 2 {
        let raw: Vec<&BTreeMap<u32, f64>> = layers.iter().map(|l| &l.kl).collect();
        let n_floor = opts.n_floor_per_block;
        apply_block_floor(
            &mut alloc,
            &names,
            &blocks,
            &raw,
            (lowest, bits[1]),
            n_floor,
        );
    }
    let max_bits = bits[bits.len() - 1];
    let cleaned: Vec<BTreeMap<u32, f64>> =
        layers.iter().map(|l| clean_nan(&l.kl, max_bits)).collect();
    let protected = protected_layers(&names, opts.protect_first_last, opts.n_protect);
    let effective = boost_protected(&cleaned, &protected);
    let params: Vec<u64> = layers.iter().map(|l| l.param_count).collect();
    greedy(
        &mut alloc,
        &names,
        &params,
        &effective,
        &bits,
        opts.target_bpw,
    );
    if opts.max_low_bit_run > 0 && bits.len() >= 2 {
        enforce_run_limit(
            &mut alloc,
            &blocks,
            &cleaned,
            lowest,
            bits[1],
            opts.max_low_bit_run,
        );
    }
    Ok(summarize(&names, &params, &alloc, &bits))
}

/// Whether `name` is a protected layer (output/embedding, router, boundary block) in a model
/// whose blocks are `layers.0` … `layers.{n_blocks-1}` — exposed for tests and reporting.
///
/// [`allocate`] applies the same rules, but takes the first and last blocks from the indices
/// that actually occur in the table. `n_protect == 0` protects no block here.
pub fn is_protected(name: &str, n_blocks: usize, n_protect: usize) -> bool {
    if is_output_layer(name) || is_moe_protected(name) {
        return true;
    }
    let k = n_protect.min(n_blocks) as i128;
    let last = n_blocks as i128;
    layer_segment_indices(name)
        .iter()
        .any(|&i| (0..k).contains(&i) || (last - k..last).contains(&i))
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

/// Rejects options optiq would accept but misuse (see the module doc).
fn validate_options(opts: &AllocatorOptions) -> Result<(), LabError> {
    let t = opts.target_bpw;
    if !t.is_finite() || !(1.0..=f64::from(MAX_BITS)).contains(&t) {
        return Err(LabError::config(
            "target_bpw",
            format!("must be a finite number in [1, {MAX_BITS}], got {t}"),
        ));
    }
    if let Some(bits) = &opts.candidate_bits {
        validate_bits(bits, "candidate_bits")?;
    }
    if opts.protect_first_last && opts.n_protect == 0 {
        // optiq would slice `indices[-0:]`, i.e. protect every block: surely not what was meant.
        return Err(LabError::config(
            "n_protect",
            "must be at least 1 while protect_first_last is set (set protect_first_last to false \
             to protect no block)",
        ));
    }
    Ok(())
}

/// A candidate list must be non-empty, in 1..=16, without repeats (optiq would never upgrade
/// past a repeated width: the step to itself has no KL reduction).
fn validate_bits(bits: &[u32], field: &str) -> Result<(), LabError> {
    if bits.is_empty() {
        return Err(LabError::config(
            field,
            "must not be empty (leave it unset to use the widths measured in the sensitivity table)",
        ));
    }
    let mut seen = BTreeSet::new();
    for &b in bits {
        if !(1..=MAX_BITS).contains(&b) {
            return Err(LabError::config(
                field,
                format!("{b} is outside 1..={MAX_BITS}"),
            ));
        }
        if !seen.insert(b) {
            return Err(LabError::config(field, format!("{b} is listed twice")));
        }
    }
    Ok(())
}

/// Rejects tables that cannot be allocated faithfully: unnamed, repeated or empty layers, or
/// more bits than an `f64` counts exactly.
fn validate_layers(layers: &[LayerSensitivity]) -> Result<(), LabError> {
    let mut seen = HashSet::new();
    let mut total: u128 = 0;
    for l in layers {
        if l.name.is_empty() {
            return Err(LabError::config("name", "a layer has an empty name"));
        }
        // The allocation is keyed by name, as in optiq: two entries would share one slot.
        if !seen.insert(l.name.as_str()) {
            return Err(LabError::config(
                "name",
                format!("layer {} is listed twice", l.name),
            ));
        }
        if l.param_count == 0 {
            return Err(LabError::config(
                "param_count",
                format!("layer {} has no parameters", l.name),
            ));
        }
        total += u128::from(l.param_count);
    }
    if total * u128::from(MAX_BITS) >= EXACT_LIMIT {
        return Err(LabError::config(
            "param_count",
            format!("{total} parameters in all: too many for exact bit accounting"),
        ));
    }
    Ok(())
}

/// The candidate widths, ascending: the given list, else every measured width, else `[4, 8]`.
fn candidate_bits(
    layers: &[LayerSensitivity],
    opts: &AllocatorOptions,
) -> Result<Vec<u32>, LabError> {
    if let Some(given) = &opts.candidate_bits {
        let mut bits = given.clone();
        bits.sort_unstable();
        return Ok(bits);
    }
    let measured: BTreeSet<u32> = layers.iter().flat_map(|l| l.kl.keys().copied()).collect();
    if measured.is_empty() {
        return Ok(vec![4, 8]);
    }
    let bits: Vec<u32> = measured.into_iter().collect();
    validate_bits(&bits, "kl")?;
    Ok(bits)
}

mod names;
mod py_heap;
mod py_sort;
mod steps;

use names::*;
use steps::*;

#[cfg(test)]
mod tests;
