//! Dot products between one weight row and one activation row, with per-level dispatch.
//!
//! SIMD coverage: AVX2 for every type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, F32, F16,
//! BF16); AVX-512 VNNI for Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K (other types at the AVX-512
//! level use their AVX2 kernel). Token tiles (one weight row × several tokens, for prefill)
//! are in [`crate::matmul::tile`].

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "x86_64")]
pub mod avx_vnni;
pub mod scalar;

use crate::error::{KernelError, Result};
use crate::format::types::GgmlType;
use crate::level::{CpuLevel, cpu_level};
use crate::quantize::{ActFormat, ActRow};

/// Dot product of a weight row (raw ggml bytes of type `weight_ty`) with an activation row in
/// the matching format, at the process-wide [`cpu_level`].
pub fn vec_dot(weight_ty: GgmlType, weight_row: &[u8], act: ActRow<'_>) -> Result<f32> {
    vec_dot_at(cpu_level(), weight_ty, weight_row, act)
}

/// Like [`vec_dot`] but at an explicit level (clamped to what the CPU supports, so any value
/// is safe); tests use it to compare levels.
pub fn vec_dot_at(
    level: CpuLevel,
    weight_ty: GgmlType,
    weight_row: &[u8],
    act: ActRow<'_>,
) -> Result<f32> {
    check_dot_args(weight_ty, weight_row, act)?;
    Ok(dot_unchecked(
        level.clamp_to_hardware(),
        weight_ty,
        weight_row,
        act,
    ))
}

/// The checks of [`vec_dot_at`]: `act` has the format `weight_ty` pairs with, and
/// `weight_row` holds exactly as many elements as `act`.
pub(crate) fn check_dot_args(
    weight_ty: GgmlType,
    weight_row: &[u8],
    act: ActRow<'_>,
) -> Result<()> {
    let need_fmt = ActFormat::for_weight(weight_ty)?;
    if act.format() != need_fmt {
        return Err(KernelError::ActivationMismatch {
            weight: weight_ty,
            need: need_fmt,
            have: act.format(),
        });
    }
    let need = weight_ty.row_bytes(act.n_elems())?;
    if weight_row.len() != need {
        return Err(KernelError::LengthMismatch {
            what: "vec_dot weight row bytes",
            expected: need,
            actual: weight_row.len(),
        });
    }
    Ok(())
}

/// Dispatch without length checks. `level` must not exceed the hardware level (callers pass
/// a clamped level). Mismatched lengths cannot cause out-of-bounds access (every kernel zips
/// blocks), only a meaningless result; mismatched formats return 0.
#[inline]
pub(crate) fn dot_unchecked(level: CpuLevel, ty: GgmlType, w: &[u8], act: ActRow<'_>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level >= CpuLevel::Avx2
        && let Some(v) = dot_x86(level, ty, w, act)
    {
        return v;
    }
    let _ = level;
    use ActRow as A;
    use GgmlType as T;
    match (ty, act) {
        (T::F32, A::F32(x)) => scalar::f32_f32(w.as_chunks().0, x),
        (T::F16, A::F32(x)) => scalar::f16_f32(w.as_chunks().0, x),
        (T::BF16, A::F32(x)) => scalar::bf16_f32(w.as_chunks().0, x),
        (T::Q4_0, A::Q8_0(a)) => scalar::q4_0_q8_0(w.as_chunks().0, a),
        (T::Q5_0, A::Q8_0(a)) => scalar::q5_0_q8_0(w.as_chunks().0, a),
        (T::Q8_0, A::Q8_0(a)) => scalar::q8_0_q8_0(w.as_chunks().0, a),
        (T::Q4_1, A::Q8_1(a)) => scalar::q4_1_q8_1(w.as_chunks().0, a),
        (T::Q5_1, A::Q8_1(a)) => scalar::q5_1_q8_1(w.as_chunks().0, a),
        (T::Q2_K, A::Q8K(a)) => scalar::q2_k_q8_k(w.as_chunks().0, a),
        (T::Q3_K, A::Q8K(a)) => scalar::q3_k_q8_k(w.as_chunks().0, a),
        (T::Q4_K, A::Q8K(a)) => scalar::q4_k_q8_k(w.as_chunks().0, a),
        (T::Q5_K, A::Q8K(a)) => scalar::q5_k_q8_k(w.as_chunks().0, a),
        (T::Q6_K, A::Q8K(a)) => scalar::q6_k_q8_k(w.as_chunks().0, a),
        _ => 0.0,
    }
}

/// The x86 SIMD kernel for (`level`, `ty`), or `None` if that type has none.
#[cfg(target_arch = "x86_64")]
#[inline]
fn dot_x86(level: CpuLevel, ty: GgmlType, w: &[u8], act: ActRow<'_>) -> Option<f32> {
    use ActRow as A;
    use GgmlType as T;
    debug_assert!(level <= crate::level::hardware_level());
    // SAFETY: `level` never exceeds the detected hardware level (all callers clamp), and
    // Avx2/Avx512 are only detected when every feature these kernels enable is present.
    unsafe {
        if level >= CpuLevel::Avx512 {
            match (ty, act) {
                (T::Q4_1, A::Q8_1(a)) => return Some(avx512::q4_1_q8_1(w.as_chunks().0, a)),
                (T::Q5_0, A::Q8_0(a)) => return Some(avx512::q5_0_q8_0(w.as_chunks().0, a)),
                (T::Q8_0, A::Q8_0(a)) => return Some(avx512::q8_0_q8_0(w.as_chunks().0, a)),
                (T::Q4_K, A::Q8K(a)) => return Some(avx512::q4_k_q8_k(w.as_chunks().0, a)),
                (T::Q5_K, A::Q8K(a)) => return Some(avx512::q5_k_q8_k(w.as_chunks().0, a)),
                (T::Q6_K, A::Q8K(a)) => return Some(avx512::q6_k_q8_k(w.as_chunks().0, a)),
                _ => {}
            }
        }
        Some(match (ty, act) {
            (T::F32, A::F32(x)) => avx2::f32_f32(w.as_chunks().0, x),
            (T::F16, A::F32(x)) => avx2::f16_f32(w.as_chunks().0, x),
            (T::BF16, A::F32(x)) => avx2::bf16_f32(w.as_chunks().0, x),
            (T::Q4_0, A::Q8_0(a)) => avx2::q4_0_q8_0(w.as_chunks().0, a),
            (T::Q5_0, A::Q8_0(a)) => avx2::q5_0_q8_0(w.as_chunks().0, a),
            (T::Q8_0, A::Q8_0(a)) => avx2::q8_0_q8_0(w.as_chunks().0, a),
            (T::Q4_1, A::Q8_1(a)) => avx2::q4_1_q8_1(w.as_chunks().0, a),
            (T::Q5_1, A::Q8_1(a)) => avx2::q5_1_q8_1(w.as_chunks().0, a),
            (T::Q2_K, A::Q8K(a)) => avx2::q2_k_q8_k(w.as_chunks().0, a),
            (T::Q3_K, A::Q8K(a)) => avx2::q3_k_q8_k(w.as_chunks().0, a),
            (T::Q4_K, A::Q8K(a)) => avx2::q4_k_q8_k(w.as_chunks().0, a),
            (T::Q5_K, A::Q8K(a)) => avx2::q5_k_q8_k(w.as_chunks().0, a),
            (T::Q6_K, A::Q8K(a)) => avx2::q6_k_q8_k(w.as_chunks().0, a),
            _ => return None,
        })
    }
}

/// Token-tile activation rows cut to the weight row's block count (or the shortest row's), as
/// the row kernels' `zip` cuts them; returns that count.
#[inline(always)]
pub(crate) fn cut<'a, B, W, const N: usize>(w: &[W], a: [&'a [B]; N]) -> (usize, [&'a [B]; N]) {
    let n = a.iter().fold(w.len(), |n, r| n.min(r.len()));
    (n, a.map(|r| &r[..n]))
}

/// f32 dot product at `level` (clamped to the hardware), used for f32 weight matrices.
pub fn dot_f32_at(level: CpuLevel, w: &[f32], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx2 {
        // SAFETY: the clamped level guarantees avx2+fma.
        return unsafe { avx2::f32s_f32(w, x) };
    }
    let _ = level;
    scalar::f32s_f32(w, x)
}
