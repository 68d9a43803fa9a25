//! Row codecs for a quantized KV cache. A row is one head vector of `dim` f32 values (one key
//! or value of one head at one position), stored as a fixed number of bytes.
//!
//! Two codecs:
//! - [`AffineCodec`]: MLX-style per-group `scale·code + bias`, cheap and format-compatible with
//!   what MLX-converted models expect.
//! - [`TurboCodec`]: TurboQuant without the QJL residual: a random orthogonal rotation makes
//!   every coordinate of a unit vector roughly N(0, 1/dim), so a single Lloyd–Max codebook for
//!   N(0, 1) ([`lloyd_max`]) quantizes all coordinates near-optimally; only the norm is stored.
//!   Its rows live in the rotated space: attention rotates the query once and un-rotates the
//!   output once, so the per-position work never touches the rotation.
//!
//! Both store codes first as an LSB-first bitstream ([`pack_bits`]) followed by f16 side data.
//! The per-position entry points (`dot*`, `axpy*`) never allocate: they unpack into a stack
//! buffer and run plain chunked loops the compiler vectorises.

pub mod affine;
mod affine_tile;
pub mod half_conv;
pub mod lloyd_max;
pub mod turbo;
mod turbo_tile;

pub use affine::AffineCodec;
pub use turbo::{TURBO_DIMS, TurboCodec};

use half::f16;

/// Packs `codes` (each `< 2^bits`, higher bits ignored) LSB-first into `out`, which must hold at
/// least `ceil(codes.len() * bits / 8)` bytes; exactly that many are written.
pub fn pack_bits(codes: &[u8], bits: u8, out: &mut [u8]) {
    let out = &mut out[..(codes.len() * usize::from(bits)).div_ceil(8)];
    match bits {
        8 => out.copy_from_slice(codes),
        4 => {
            let mut pairs = codes.chunks_exact(2);
            for (o, p) in out.iter_mut().zip(&mut pairs) {
                *o = (p[0] & 0x0f) | (p[1] << 4);
            }
            if let [last] = pairs.remainder() {
                out[out.len() - 1] = last & 0x0f;
            }
        }
        1 => pack_eights::<1>(codes, out),
        2 => pack_eights::<2>(codes, out),
        3 => pack_eights::<3>(codes, out),
        5 => pack_eights::<5>(codes, out),
        6 => pack_eights::<6>(codes, out),
        7 => pack_eights::<7>(codes, out),
        _ => panic!("bit width {bits} outside 1..=8"),
    }
}

/// Eight codes fill exactly `B` bytes: assemble them in a u64 without per-bit bookkeeping
/// (`B` constant, so every shift is too); only a ragged tail takes the bit-by-bit path.
fn pack_eights<const B: usize>(codes: &[u8], out: &mut [u8]) {
    let mask = (1u64 << B) - 1;
    let mut eights = codes.chunks_exact(8);
    for (c, o) in (&mut eights).zip(out.chunks_exact_mut(B)) {
        let mut w = 0u64;
        for (k, &c) in c.iter().enumerate() {
            w |= (u64::from(c) & mask) << (k * B);
        }
        o.copy_from_slice(&w.to_le_bytes()[..B]);
    }
    pack_tail(eights.remainder(), B as u8, &mut out[codes.len() / 8 * B..]);
}

fn pack_tail(codes: &[u8], bits: u8, out: &mut [u8]) {
    let mask = u32::from(low_mask(bits));
    let (mut acc, mut fill, mut j) = (0u32, 0u32, 0usize);
    for &c in codes {
        acc |= (u32::from(c) & mask) << fill;
        fill += u32::from(bits);
        // bits ≤ 8, so at most one byte is complete after each code.
        if fill >= 8 {
            out[j] = acc as u8;
            acc >>= 8;
            fill -= 8;
            j += 1;
        }
    }
    if fill > 0 {
        out[j] = acc as u8;
    }
}

/// Unpacks `n` codes of `bits` bits from the LSB-first bitstream `src` into `out[..n]`.
pub fn unpack_bits(src: &[u8], bits: u8, n: usize, out: &mut [u8]) {
    let out = &mut out[..n];
    let src = &src[..(n * usize::from(bits)).div_ceil(8)];
    match bits {
        8 => out.copy_from_slice(src),
        4 => {
            let mut pairs = out.chunks_exact_mut(2);
            for (p, &b) in (&mut pairs).zip(src) {
                p[0] = b & 0x0f;
                p[1] = b >> 4;
            }
            if let [last] = pairs.into_remainder() {
                *last = src[src.len() - 1] & 0x0f;
            }
        }
        1 => unpack_eights::<1>(src, out),
        2 => unpack_eights::<2>(src, out),
        3 => unpack_eights::<3>(src, out),
        5 => unpack_eights::<5>(src, out),
        6 => unpack_eights::<6>(src, out),
        7 => unpack_eights::<7>(src, out),
        _ => panic!("bit width {bits} outside 1..=8"),
    }
}

/// The inverse of [`pack_eights`].
fn unpack_eights<const B: usize>(src: &[u8], out: &mut [u8]) {
    let mask = (1u64 << B) - 1;
    let n = out.len();
    let mut eights = out.chunks_exact_mut(8);
    for (o, s) in (&mut eights).zip(src.chunks_exact(B)) {
        let mut w = [0u8; 8];
        w[..B].copy_from_slice(s);
        let w = u64::from_le_bytes(w);
        for (k, o) in o.iter_mut().enumerate() {
            *o = ((w >> (k * B)) & mask) as u8;
        }
    }
    unpack_tail(&src[n / 8 * B..], B as u8, eights.into_remainder());
}

fn unpack_tail(src: &[u8], bits: u8, out: &mut [u8]) {
    let mask = u32::from(low_mask(bits));
    let (mut acc, mut fill, mut j) = (0u32, 0u32, 0usize);
    for o in out.iter_mut() {
        if fill < u32::from(bits) {
            acc |= u32::from(src[j]) << fill;
            fill += 8;
            j += 1;
        }
        *o = (acc & mask) as u8;
        acc >>= bits;
        fill -= u32::from(bits);
    }
}

/// The codes of one packed run of `n` values: borrowed as is at 8 bits, otherwise unpacked
/// into `buf`.
#[inline]
fn codes_of<'a>(packed: &'a [u8], bits: u8, n: usize, buf: &'a mut [u8]) -> &'a [u8] {
    if bits == 8 {
        &packed[..n]
    } else {
        unpack_bits(packed, bits, n, buf);
        &buf[..n]
    }
}

fn low_mask(bits: u8) -> u8 {
    (((1u16) << bits) - 1) as u8
}

/// f16 that never becomes inf or NaN: out-of-range values saturate to ±f16::MAX and NaN maps to
/// 0, so a hostile input degrades one row instead of poisoning every dot product with it.
fn f16_saturating(v: f32) -> f16 {
    if v.is_nan() {
        return f16::ZERO;
    }
    f16::from_f32(v.clamp(-f16::MAX.to_f32(), f16::MAX.to_f32()))
}

/// f16 bits to f32, exactly (NaNs stay NaN), inline at every level: every decoded row reads one
/// or two f16 parameters per group, and `half`'s conversion is a call behind a CPU-feature
/// check.
#[inline(always)]
fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let magnitude = u32::from(h & 0x7fff);
    let exponent = magnitude >> 10;
    let bits = if exponent == 0 {
        // Zero or subnormal: mantissa · 2^-24, exact in f32.
        (magnitude as f32 * f32::from_bits(0x3380_0000)).to_bits()
    } else if exponent == 0x1f {
        // Infinity or NaN: all-ones exponent, the mantissa moved up; a NaN is made quiet and
        // keeps its payload, as F16C does.
        0x7f80_0000 | (magnitude & 0x3ff) << 13 | u32::from(magnitude & 0x3ff != 0) << 22
    } else {
        (magnitude << 13) + ((127 - 15) << 23)
    };
    f32::from_bits(sign | bits)
}

/// One tile decoder compiled at each instruction-set level: `(codec, encoded rows, output)`.
struct TileForms<C> {
    #[cfg(target_arch = "x86_64")]
    avx512: unsafe fn(&C, &[u8], &mut [f32]),
    #[cfg(target_arch = "x86_64")]
    avx2: unsafe fn(&C, &[u8], &mut [f32]),
    portable: fn(&C, &[u8], &mut [f32]),
}

/// Checks a tile's sizes (`out` whole rows of `dim`, `rows` at least as many encoded rows of
/// `row_bytes`) and runs `forms`' decoder for `level`.
///
/// # Safety
/// `forms.avx512` needs only AVX-512F/BW and `forms.avx2` only AVX2 (with F16C).
unsafe fn decode_tile<C>(
    codec: &C,
    (dim, row_bytes): (usize, usize),
    level: crate::level::CpuLevel,
    rows: &[u8],
    out: &mut [f32],
    forms: TileForms<C>,
) {
    use crate::level::CpuLevel;
    assert!(out.len().is_multiple_of(dim), "output is not whole rows");
    let n = out.len() / dim;
    assert!(
        rows.len() >= n * row_bytes,
        "fewer encoded rows than outputs"
    );
    let rows = &rows[..n * row_bytes];
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx512 {
        // SAFETY: the AVX-512 level includes F and BW (the level is clamped to the hardware).
        return unsafe { (forms.avx512)(codec, rows, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if level.clamp_to_hardware() >= CpuLevel::Avx2 {
        // SAFETY: the AVX2 level includes F16C (the level is clamped to the hardware).
        return unsafe { (forms.avx2)(codec, rows, out) };
    }
    let _ = level;
    (forms.portable)(codec, rows, out)
}

/// The little-endian f16 at the start of `b`, as f32.
#[inline(always)]
fn read_f16(b: &[u8]) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// Checks a caller-chosen parameter, naming the codec and the supported set in the error.
fn check_param(ok: bool, what: impl FnOnce() -> String) -> crate::Result<()> {
    if ok {
        Ok(())
    } else {
        Err(crate::KernelError::UnsupportedParam(what()))
    }
}

/// The tile decoders' test: `n` rows of `row_bytes`, most quantized by `encode` from Gaussian
/// values at hostile spreads (1, 1e-6, 6e4, 0), every fifth one random bytes (any codes, NaN or
/// infinite side data), decoded as a tile by `tile` at every level the CPU has must equal `row`
/// decoding each row, bit for bit or NaN for NaN.
#[cfg(test)]
pub(crate) fn check_tiles_against_rows(
    (dim, row_bytes, seed): (usize, usize, u64),
    encode: impl Fn(&[f32], &mut [u8]),
    row: impl Fn(&[u8], &mut [f32]),
    tile: impl Fn(crate::level::CpuLevel, &[u8], &mut [f32]),
    what: &str,
) {
    let n = 13;
    let mut rng = TestRng::new(seed);
    let mut rows = vec![0u8; n * row_bytes];
    for (r, bytes) in rows.chunks_exact_mut(row_bytes).enumerate() {
        if r % 5 == 4 {
            bytes.iter_mut().for_each(|b| *b = rng.next_u64() as u8);
            continue;
        }
        let spread = [1.0, 1e-6, 6e4, 0.0][r % 4];
        let x: Vec<f32> = (0..dim).map(|_| rng.gaussian() * spread).collect();
        encode(&x, bytes);
    }
    let mut want = vec![0f32; n * dim];
    for (bytes, o) in rows.chunks_exact(row_bytes).zip(want.chunks_exact_mut(dim)) {
        row(bytes, o);
    }
    for level in crate::supported_levels() {
        let mut got = vec![f32::NAN; n * dim];
        tile(level, &rows, &mut got);
        let same = got
            .iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()));
        assert!(same, "{what}, {level:?}");
    }
}

/// Tiny deterministic generator for the tests (xorshift64 + Box–Muller).
#[cfg(test)]
pub(crate) struct TestRng(u64);

#[cfg(test)]
impl TestRng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(crate) fn gaussian(&mut self) -> f32 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_matches_half_for_every_pattern() {
        for h in 0..=u16::MAX {
            let (got, want) = (f16_bits_to_f32(h), half::f16::from_bits(h).to_f32());
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn pack_unpack_round_trip_every_width() {
        let mut rng = TestRng::new(7);
        for bits in 1..=8u8 {
            for n in [1usize, 3, 7, 8, 13, 16, 24, 64, 128, 136] {
                let codes: Vec<u8> = (0..n)
                    .map(|_| rng.next_u64() as u8 & low_mask(bits))
                    .collect();
                let mut packed = vec![0xAAu8; (n * usize::from(bits)).div_ceil(8)];
                pack_bits(&codes, bits, &mut packed);
                let mut back = vec![0u8; n];
                unpack_bits(&packed, bits, n, &mut back);
                assert_eq!(back, codes, "bits {bits} n {n}");
            }
        }
    }

    #[test]
    fn pack_layout_is_lsb_first() {
        let mut out = [0u8; 2];
        pack_bits(&[1, 2, 3, 4], 4, &mut out);
        assert_eq!(out, [0x21, 0x43]);
        let mut out = [0u8; 3];
        // 3-bit codes 1..=8 (8 masks to 0): bit stream 001 010 011 100 101 110 111 000.
        pack_bits(&[1, 2, 3, 4, 5, 6, 7, 8], 3, &mut out);
        assert_eq!(out, [0b1101_0001, 0b0101_1000, 0b0001_1111]);
        let mut out = [0u8; 1];
        pack_bits(&[1, 0, 1, 1, 0, 0, 0, 1], 1, &mut out);
        assert_eq!(out, [0b1000_1101]);
    }

    #[test]
    fn pack_ignores_high_bits_and_handles_odd_nibbles() {
        let mut out = [0u8; 2];
        pack_bits(&[0xF1, 0xF2, 0xF3], 4, &mut out);
        assert_eq!(out, [0x21, 0x03]);
        let mut back = [0u8; 3];
        unpack_bits(&out, 4, 3, &mut back);
        assert_eq!(back, [1, 2, 3]);
    }

    #[test]
    fn f16_saturation() {
        assert_eq!(f16_saturating(1e9), f16::MAX);
        assert_eq!(f16_saturating(f32::NEG_INFINITY), f16::MIN);
        assert_eq!(f16_saturating(f32::NAN), f16::ZERO);
        assert_eq!(f16_saturating(0.5).to_f32(), 0.5);
    }
}
