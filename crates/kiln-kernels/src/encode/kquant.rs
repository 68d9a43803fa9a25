//! K-quant encoders: 256-element super-blocks with per-sub-block scales (and mins), as ggml's
//! reference quantizers build them (`quantize_row_q{2..6}_K_ref`, no importance matrix).
//!
//! Every format is made in three steps: fit each sub-block on its own
//! ([`super::kquant_search`]); quantize the sub-block scales themselves to a few bits against
//! one f16 super-scale; then round every element again against the scale it will actually be
//! decoded with (the f16 super-scale times the quantized sub-scale), since that, not the fitted
//! scale, is what the decoder multiplies by. A sub-block whose decoded scale is 0 keeps the
//! codes of its fit (they decode to 0 or to the minimum either way).

use super::kquant_search::{
    Affine, AffineGrid, GROUP_EPS, affine_search, nearest_int, q3_search, signed_absmax,
    symmetric_search,
};
use crate::format::blocks::{
    Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, k4_scales_mins, q3k_scales,
};
use half::f16;

/// Stores `v` as a little-endian f16 at `out[..2]` and returns the value the decoder will see.
fn put_f16(out: &mut [u8], v: f32) -> f32 {
    let h = f16::from_f32(v);
    out[..2].copy_from_slice(&h.to_bits().to_le_bytes());
    h.to_f32()
}

/// The largest of `v` (and 0), comparing as ggml's `if (v > m) m = v` loop does.
fn running_max(v: impl IntoIterator<Item = f32>) -> f32 {
    v.into_iter().fold(0.0, |m, s| if s > m { s } else { m })
}

/// Packs 256 two-bit codes the way Q2_K / Q3_K store them: each 128-element half fills 32
/// bytes, element `l + 32·s` of the half in bits `2s..2s+2` of byte `l`.
fn pack_2bit(codes: &[u8; 256], qs: &mut [u8]) {
    for (c, q) in codes.chunks_exact(128).zip(qs.chunks_exact_mut(32)) {
        for (l, b) in q.iter_mut().enumerate() {
            *b = c[l] | (c[l + 32] << 2) | (c[l + 64] << 4) | (c[l + 96] << 6);
        }
    }
}

/// Encodes one Q2_K super-block: 16 affine sub-blocks of 16 with 2-bit codes, their scales and
/// mins each quantized to 4 bits (one byte per sub-block: scale low, min high).
pub(super) fn q2_k(x: &[f32; 256], out: &mut [u8; Q2_K_BYTES]) {
    // Unlike Q4_K / Q5_K, ggml scores Q2_K's candidates by |x|-weighted absolute error.
    let grid = AffineGrid {
        rmin: -0.5,
        rdelta: 0.1,
        steps: 15,
        mad: true,
    };
    let mut codes = [0u8; 256];
    let mut fits = [Affine::default(); 16];
    for ((xs, cs), fit) in x
        .chunks_exact(16)
        .zip(codes.chunks_exact_mut(16))
        .zip(&mut fits)
    {
        let w: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
        *fit = affine_search(xs, &w, 3, grid, cs);
    }
    let max_scale = running_max(fits.iter().map(|f| f.scale));
    let max_min = running_max(fits.iter().map(|f| f.min));
    let mut scales = [0u8; 16];
    let mut d = 0.0;
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for (s, f) in scales.iter_mut().zip(&fits) {
            *s = nearest_int(iscale * f.scale) as u8;
        }
        d = max_scale / 15.0;
    }
    let mut dmin = 0.0;
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for (s, f) in scales.iter_mut().zip(&fits) {
            *s |= (nearest_int(iscale * f.min) << 4) as u8;
        }
        dmin = max_min / 15.0;
    }
    let d = put_f16(&mut out[80..82], d);
    let dmin = put_f16(&mut out[82..84], dmin);
    for ((xs, cs), &s) in x
        .chunks_exact(16)
        .zip(codes.chunks_exact_mut(16))
        .zip(&scales)
    {
        let dl = d * (s & 0xF) as f32;
        if dl == 0.0 {
            continue;
        }
        let ml = dmin * (s >> 4) as f32;
        for (c, &v) in cs.iter_mut().zip(xs) {
            *c = nearest_int((v + ml) / dl).clamp(0, 3) as u8;
        }
    }
    out[..16].copy_from_slice(&scales);
    pack_2bit(&codes, &mut out[16..80]);
}

/// Packs the sixteen 6-bit Q3_K scales (already offset to `0..64`) into 12 bytes: low nibbles
/// in bytes 0..8 (sub-blocks 8..16 in the high nibbles), the top two bits in bytes 8..12.
fn pack_q3_scales(codes: &[u8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &l) in codes.iter().enumerate() {
        if j < 8 {
            s[j] = l & 0xF;
        } else {
            s[j - 8] |= (l & 0xF) << 4;
        }
        s[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
    }
    s
}

/// Encodes one Q3_K super-block: 16 symmetric sub-blocks of 16 with 3-bit codes (two low bits
/// in `qs`, the high bit in `hmask`) and 6-bit signed sub-block scales.
pub(super) fn q3_k(x: &[f32; 256], out: &mut [u8; Q3_K_BYTES]) {
    let mut codes = [0i8; 256];
    let mut scales = [0.0f32; 16];
    for ((xs, cs), s) in x
        .chunks_exact(16)
        .zip(codes.chunks_exact_mut(16))
        .zip(&mut scales)
    {
        *s = q3_search(xs, 4, cs);
    }
    // Signed: the sub-block scale of largest magnitude maps to −32, the wider end of 6 bits.
    let (_, max_scale) = signed_absmax(&scales);
    let mut scale_codes = [0u8; 16];
    let mut d = 0.0;
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (c, &s) in scale_codes.iter_mut().zip(&scales) {
            // ggml stores the rounded value in an int8 before clamping.
            *c = (i32::from(nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
        }
        d = 1.0 / iscale;
    }
    let packed = pack_q3_scales(&scale_codes);
    let d = put_f16(&mut out[108..110], d);
    let decoded = q3k_scales(&packed);
    for ((xs, cs), &sc) in x
        .chunks_exact(16)
        .zip(codes.chunks_exact_mut(16))
        .zip(&decoded)
    {
        let dl = d * sc as f32;
        if dl == 0.0 {
            continue;
        }
        for (c, &v) in cs.iter_mut().zip(xs) {
            *c = (nearest_int(v / dl).clamp(-4, 3) + 4) as i8;
        }
    }
    out[96..108].copy_from_slice(&packed);
    // Bit plane p of hmask holds the high bits of elements 32p..32p+32.
    let (hmask, rest) = out.split_at_mut(32);
    hmask.fill(0);
    let mut low = [0u8; 256];
    for (j, (&c, l)) in codes.iter().zip(&mut low).enumerate() {
        let c = c as u8;
        if c > 3 {
            hmask[j % 32] |= 1 << (j / 32);
        }
        *l = if c > 3 { c - 4 } else { c };
    }
    pack_2bit(&low, &mut rest[..64]);
}

/// The sub-block fits of Q4_K / Q5_K: 8 affine sub-blocks of 32, weighted by `rms + |x|` (so
/// large elements count more, but small ones still count).
fn k4_fits(x: &[f32; 256], nmax: u8, grid: AffineGrid, codes: &mut [u8; 256]) -> [Affine; 8] {
    let mut fits = [Affine::default(); 8];
    for ((xs, cs), fit) in x
        .chunks_exact(32)
        .zip(codes.chunks_exact_mut(32))
        .zip(&mut fits)
    {
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let rms = (sum_x2 / 32.0).sqrt();
        let w: [f32; 32] = std::array::from_fn(|l| rms + xs[l].abs());
        *fit = affine_search(xs, &w, nmax, grid, cs);
    }
    fits
}

/// Quantizes the fits' scales and mins to 6 bits against f16 super-scales, writes the 16-byte
/// Q4_K / Q5_K header (`d`, `dmin`, 12 scale bytes) and re-rounds `codes` against the decoded
/// sub-block scales.
fn k4_header(x: &[f32; 256], fits: &[Affine; 8], nmax: u8, hdr: &mut [u8], codes: &mut [u8]) {
    let max_scale = running_max(fits.iter().map(|f| f.scale));
    let max_min = running_max(fits.iter().map(|f| f.min));
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let s = &mut hdr[4..16];
    for (j, f) in fits.iter().enumerate() {
        // ggml keeps the rounded value in a uint8 (wrapping) before taking the minimum.
        let ls = (nearest_int(inv_scale * f.scale) as u8).min(63);
        let lm = (nearest_int(inv_min * f.min) as u8).min(63);
        if j < 4 {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
    let d = put_f16(&mut hdr[0..2], max_scale / 63.0);
    let dmin = put_f16(&mut hdr[2..4], max_min / 63.0);
    let (sc, mn) = k4_scales_mins(&hdr[4..16]);
    for (j, (xs, cs)) in x
        .chunks_exact(32)
        .zip(codes.chunks_exact_mut(32))
        .enumerate()
    {
        let dl = d * sc[j] as f32;
        if dl == 0.0 {
            continue;
        }
        let ml = dmin * mn[j] as f32;
        for (c, &v) in cs.iter_mut().zip(xs) {
            *c = nearest_int((v + ml) / dl).clamp(0, i32::from(nmax)) as u8;
        }
    }
}

/// Encodes one Q4_K super-block: 8 affine sub-blocks of 32 with 4-bit codes and 6-bit scales
/// and mins.
pub(super) fn q4_k(x: &[f32; 256], out: &mut [u8; Q4_K_BYTES]) {
    let grid = AffineGrid {
        rmin: -1.0,
        rdelta: 0.1,
        steps: 20,
        mad: false,
    };
    let mut codes = [0u8; 256];
    let fits = k4_fits(x, 15, grid, &mut codes);
    k4_header(x, &fits, 15, &mut out[..16], &mut codes);
    // Each 64 elements fill 32 bytes: the first 32 in the low nibbles, the next 32 high.
    for (c, q) in codes.chunks_exact(64).zip(out[16..].chunks_exact_mut(32)) {
        for (l, b) in q.iter_mut().enumerate() {
            *b = c[l] | (c[l + 32] << 4);
        }
    }
}

/// Encodes one Q5_K super-block: as Q4_K with 5-bit codes, the fifth bits in `qh`.
pub(super) fn q5_k(x: &[f32; 256], out: &mut [u8; Q5_K_BYTES]) {
    let grid = AffineGrid {
        rmin: -0.5,
        rdelta: 0.1,
        steps: 15,
        mad: false,
    };
    let mut codes = [0u8; 256];
    let fits = k4_fits(x, 31, grid, &mut codes);
    k4_header(x, &fits, 31, &mut out[..16], &mut codes);
    let (qh, qs) = out[16..].split_at_mut(32);
    qh.fill(0);
    // As Q4_K's nibbles; the pair of 32-element halves `j` owns bits 2j and 2j+1 of qh.
    for (j, (c, q)) in codes
        .chunks_exact(64)
        .zip(qs.chunks_exact_mut(32))
        .enumerate()
    {
        for (l, b) in q.iter_mut().enumerate() {
            let (lo, hi) = (c[l], c[l + 32]);
            *b = (lo & 0xF) | ((hi & 0xF) << 4);
            qh[l] |= ((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1));
        }
    }
}

/// Encodes one Q6_K super-block: 16 symmetric sub-blocks of 16 with 6-bit codes (low nibbles
/// in `ql`, top two bits in `qh`) and int8 sub-block scales.
pub(super) fn q6_k(x: &[f32; 256], out: &mut [u8; Q6_K_BYTES]) {
    let mut codes = [0i8; 256];
    let mut scales = [0.0f32; 16];
    for ((xs, cs), s) in x
        .chunks_exact(16)
        .zip(codes.chunks_exact_mut(16))
        .zip(&mut scales)
    {
        *s = symmetric_search(xs, 32, cs);
    }
    let (max_abs, max_scale) = signed_absmax(&scales);
    if max_abs < GROUP_EPS {
        out.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    let d = put_f16(&mut out[208..210], 1.0 / iscale);
    let mut sc = [0i8; 16];
    for (c, &s) in sc.iter_mut().zip(&scales) {
        // ggml narrows to int8 after the minimum, wrapping.
        *c = nearest_int(iscale * s).min(127) as i8;
    }
    for ((xs, cs), &s) in x.chunks_exact(16).zip(codes.chunks_exact_mut(16)).zip(&sc) {
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        for (c, &v) in cs.iter_mut().zip(xs) {
            *c = (nearest_int(v / dl).clamp(-32, 31) + 32) as i8;
        }
    }
    for (j, s) in sc.iter().enumerate() {
        out[192 + j] = *s as u8;
    }
    let (ql, rest) = out.split_at_mut(128);
    // Each 128 elements: four 32-element quarters; quarters 0/1 go to the low nibbles of the
    // half's two 32-byte rows of ql, quarters 2/3 to the high nibbles; qh packs all four top
    // bit pairs of element l into byte l.
    for ((c, ql), qh) in codes
        .chunks_exact(128)
        .zip(ql.chunks_exact_mut(64))
        .zip(rest[..64].chunks_exact_mut(32))
    {
        for l in 0..32 {
            let q = [c[l], c[l + 32], c[l + 64], c[l + 96]].map(|v| v as u8);
            ql[l] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
            ql[l + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
            qh[l] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
        }
    }
}
