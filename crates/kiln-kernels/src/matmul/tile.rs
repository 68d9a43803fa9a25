//! Token tiles for prefill: one weight row against up to [`TOKEN_TILE`] tokens per call, so a
//! weight block is unpacked once per tile instead of once per token.
//!
//! SIMD tile kernels exist for Q4_1, Q5_0, Q8_0, Q4_K and Q6_K (AVX2 and AVX-512); every other
//! (type, level), the scalar level included, takes one row dot per token, which is also the
//! scalar reference the kernels are tested against.
//!
//! Most tile kernels do, per token, exactly their row kernel's arithmetic in the same order,
//! so their results are bit-identical to [`crate::vec_dot_at`] at the same level (prefill and
//! decode agree to the bit). The exception is Q8_0 / Q5_0 at the AVX-512 level: they read
//! activations interleaved four blocks at a time ([`crate::quantize::interleave`]), which needs a
//! different summation order; they match the scalar reference exactly on integer-valued data
//! and within float rounding (tested at 1e-5 of Σ|terms|) otherwise.

use std::ops::Range;

use crate::dot::{check_dot_args, dot_unchecked};
use crate::error::{KernelError, Result};
use crate::format::blocks::{BlockQ8_0, BlockQ8_1, BlockQ8K};
use crate::format::types::GgmlType;
use crate::level::CpuLevel;
use crate::quantize::interleave::BlockQ8_0x4;
use crate::quantize::{ActRow, QuantizedActivations};

/// Tokens per tile: a tile's activations stay in L1 while the task's weight rows stay in L2,
/// and the AVX-512 kernels keep one accumulator per token in registers.
pub const TOKEN_TILE: usize = 8;

/// Activation block types a tile kernel reads.
trait TileBlock: Sized {
    /// Row `t` of `acts` in this block type, or an empty row if `acts` holds another format
    /// (the kernel then yields 0, as a mismatched row dot does).
    fn row(acts: &QuantizedActivations, t: usize) -> &[Self];
}

impl TileBlock for BlockQ8_0 {
    fn row(acts: &QuantizedActivations, t: usize) -> &[Self] {
        match acts.row(t) {
            Some(ActRow::Q8_0(b)) => b,
            _ => &[],
        }
    }
}

impl TileBlock for BlockQ8_1 {
    fn row(acts: &QuantizedActivations, t: usize) -> &[Self] {
        match acts.row(t) {
            Some(ActRow::Q8_1(b)) => b,
            _ => &[],
        }
    }
}

impl TileBlock for BlockQ8K {
    fn row(acts: &QuantizedActivations, t: usize) -> &[Self] {
        match acts.row(t) {
            Some(ActRow::Q8K(b)) => b,
            _ => &[],
        }
    }
}

impl TileBlock for BlockQ8_0x4 {
    fn row(acts: &QuantizedActivations, t: usize) -> &[Self] {
        acts.row_q8_0x4(t).unwrap_or(&[])
    }
}

/// Runs the tile kernel `$m::$f::<N>` for every weight row of the tile, with
/// `N = tokens.len()`: the width is a const generic so that the per-token accumulators are a
/// fixed-size array the compiler keeps in registers. The activation rows are looked up once.
#[cfg(target_arch = "x86_64")]
macro_rules! run_tile {
    ($m:ident :: $f:ident, $B:ty, $w:expr, $acts:expr, $ts:expr, $out:expr) => {
        run_tile!(@arms $m::$f, $B, $w, $acts, $ts, $out; 8 7 6 5 4 3 2 1)
    };
    (@arms $m:ident :: $f:ident, $B:ty, $w:expr, $acts:expr, $ts:expr, $out:expr;
     $($n:literal)*) => {{
        let (t0, nt): (usize, usize) = ($ts.start, $ts.len());
        match nt {
            $($n => {
                let rows: [&[$B]; $n] = std::array::from_fn(|k| <$B>::row($acts, t0 + k));
                for (w, o) in $w.zip($out.iter_mut()) {
                    let o = o.first_chunk_mut::<$n>().expect("tile width <= TOKEN_TILE");
                    // SAFETY: only reached at a level the hardware supports (callers clamp),
                    // and that level includes every feature the kernel enables.
                    unsafe { crate::dot::$m::$f::<$n>(w.as_chunks().0, rows, o) };
                }
            })*
            _ => {}
        }
    }};
}

/// Whether (`level`, `ty`) tiles read the interleaved Q8_0 activations, which
/// [`QuantizedActivations::prepare_q8_0x4`] must then have built.
pub(crate) fn needs_q8_0x4(level: CpuLevel, ty: GgmlType) -> bool {
    cfg!(target_arch = "x86_64")
        && level >= CpuLevel::Avx512
        && matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0)
}

/// `out[i][k] = dot(weight row rs.start + i, activation row ts.start + k)` for the rows
/// `rs` of `w` (`(bytes, bytes per row)`) and at most [`TOKEN_TILE`] tokens `ts`; `out` has
/// one entry per row. `level` must not exceed the hardware level; lengths are not checked (a
/// mismatch gives a meaningless value, never an out-of-bounds access).
#[inline]
pub(crate) fn tile_unchecked(
    level: CpuLevel,
    ty: GgmlType,
    (data, rb): (&[u8], usize),
    rs: Range<usize>,
    acts: &QuantizedActivations,
    ts: Range<usize>,
    out: &mut [[f32; TOKEN_TILE]],
) {
    debug_assert!(ts.len() <= TOKEN_TILE && rs.len() == out.len());
    let w = rs.map(|r| &data[r * rb..(r + 1) * rb]);
    #[cfg(target_arch = "x86_64")]
    if !ts.is_empty() && tile_x86(level, ty, w.clone(), acts, ts.clone(), out) {
        return;
    }
    for (row, o) in w.zip(out.iter_mut()) {
        for (t, v) in ts.clone().zip(o.iter_mut()) {
            *v = acts
                .row(t)
                .map_or(0.0, |a| dot_unchecked(level, ty, row, a));
        }
    }
}

/// The SIMD tile for (`level`, `ty`) if there is one; `false` if not (nothing written).
#[cfg(target_arch = "x86_64")]
fn tile_x86<'w>(
    level: CpuLevel,
    ty: GgmlType,
    w: impl Iterator<Item = &'w [u8]>,
    acts: &QuantizedActivations,
    ts: Range<usize>,
    out: &mut [[f32; TOKEN_TILE]],
) -> bool {
    use GgmlType as T;
    debug_assert!(level <= crate::level::hardware_level());
    // Without the interleaved copy the AVX-512 Q8_0 / Q5_0 tiles would read empty rows.
    let x4 = needs_q8_0x4(level, ty) && acts.row_q8_0x4(ts.start).is_some();
    if level >= CpuLevel::Avx512 {
        match ty {
            T::Q4_1 => run_tile!(avx512::q4_1_q8_1_tile, BlockQ8_1, w, acts, ts, out),
            T::Q5_0 if x4 => run_tile!(avx512::q5_0_q8_0x4_tile, BlockQ8_0x4, w, acts, ts, out),
            T::Q8_0 if x4 => run_tile!(avx512::q8_0_q8_0x4_tile, BlockQ8_0x4, w, acts, ts, out),
            T::Q4_K => run_tile!(avx512::q4_k_q8_k_tile, BlockQ8K, w, acts, ts, out),
            T::Q6_K => run_tile!(avx512::q6_k_q8_k_tile, BlockQ8K, w, acts, ts, out),
            _ => return false,
        }
        return true;
    }
    if level >= CpuLevel::Avx2 {
        match ty {
            T::Q4_1 => run_tile!(avx2::q4_1_q8_1_tile, BlockQ8_1, w, acts, ts, out),
            T::Q5_0 => run_tile!(avx2::q5_0_q8_0_tile, BlockQ8_0, w, acts, ts, out),
            T::Q8_0 => run_tile!(avx2::q8_0_q8_0_tile, BlockQ8_0, w, acts, ts, out),
            T::Q4_K => run_tile!(avx2::q4_k_q8_k_tile, BlockQ8K, w, acts, ts, out),
            T::Q6_K => run_tile!(avx2::q6_k_q8_k_tile, BlockQ8K, w, acts, ts, out),
            _ => return false,
        }
        return true;
    }
    false
}

/// One weight row against every row of `acts` through the token tiles (taken
/// [`TOKEN_TILE`] rows at a time, the last tile ragged) at `level`, clamped to the hardware.
/// The same checks as [`crate::vec_dot_at`] apply; the activations are copied first (and
/// interleaved where the level's kernel wants that), so this is for tests and benchmarks,
/// not for hot loops.
pub fn vec_dot_tile_at(
    level: CpuLevel,
    weight_ty: GgmlType,
    weight_row: &[u8],
    acts: &[ActRow<'_>],
    out: &mut [f32],
) -> Result<()> {
    if out.len() != acts.len() {
        return Err(KernelError::LengthMismatch {
            what: "vec_dot_tile output",
            expected: acts.len(),
            actual: out.len(),
        });
    }
    for &a in acts {
        check_dot_args(weight_ty, weight_row, a)?;
    }
    let level = level.clamp_to_hardware();
    let mut held = QuantizedActivations::from_rows(acts);
    if needs_q8_0x4(level, weight_ty) {
        held.prepare_q8_0x4();
    }
    let rb = weight_row.len();
    for (i, o) in out.chunks_mut(TOKEN_TILE).enumerate() {
        let ts = i * TOKEN_TILE..i * TOKEN_TILE + o.len();
        let mut buf = [[0f32; TOKEN_TILE]];
        tile_unchecked(
            level,
            weight_ty,
            (weight_row, rb),
            0..1,
            &held,
            ts,
            &mut buf,
        );
        o.copy_from_slice(&buf[0][..o.len()]);
    }
    Ok(())
}
