//! The 16-row interleaved layouts of Q4_K, Q5_K and Q6_K ([`crate::repack`] holds the driver): one
//! group block is 16 file super-blocks (one per row, same position along the row), the same
//! bytes rearranged so that the kernels (`dot/avx512/repack_k.rs`) read, per 32 values, four
//! nibble vectors in the Q4_1 group layout — lane `k` of vector `j` is row `k`'s codes
//! `4j..4j + 4` in the low nibbles and `16 + 4j..` in the high ones — and the scales of all 16
//! rows as one vector of bytes.
//!
//! - Q4_K ([`Q4_KX16_BYTES`]): 16 f16 `d`, 16 f16 `dmin`; 128 bytes, byte `16j + k` row `k`'s
//!   6-bit scale of sub-block `j` with the top two bits of its 6-bit minimum above it; 64 bytes
//!   of the minimums' low nibbles (byte `16(j mod 4) + k`, the high nibble for `j ≥ 4`); then
//!   eight 256-byte pieces of codes, one per 32 values.
//! - Q5_K ([`Q5_KX16_BYTES`]): the Q4_K header, then eight 320-byte pieces: four nibble
//!   vectors as Q4_K's, and eight 64-bit masks of the codes' fifth bits as Q5_0's
//!   [`crate::repack::FifthBits::Masks`] (at every level).
//! - Q6_K ([`Q6_KX16_BYTES`]): 16 f16 `d`; 256 bytes, byte `16s + k` row `k`'s signed scale of
//!   the 16 values `16s..`; then eight 384-byte pieces: four nibble vectors of the codes' low
//!   four bits, and two vectors of their top two bits — in vector `h`, bits `2i..2i + 2` of
//!   byte `4k + b` belong to code `16h + 4i + b` of row `k`.
//!
//! Both are exactly as large as the file's 16 super-blocks, so the matrix repacks in place.

use crate::format::blocks::{Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES};

/// Bytes of one Q4_K group block: the header (64 + 128 + 64) and 2,048 code bytes.
pub const Q4_KX16_BYTES: usize = 16 * Q4_K_BYTES;
/// Bytes of one Q5_K group block: the Q4_K header and eight 320-byte pieces (nibbles, then
/// fifth-bit masks).
pub const Q5_KX16_BYTES: usize = 16 * Q5_K_BYTES;
/// Where the Q5_K code pieces start in a group block.
pub(crate) const Q5_K_CODES_AT: usize = 256;
/// Bytes of one Q5_K code piece (32 values of 16 rows).
pub(crate) const Q5_K_PIECE_BYTES: usize = 320;
/// Bytes of one Q6_K group block: 32 bytes of `d`, 256 of scales, 3,072 code bytes.
pub const Q6_KX16_BYTES: usize = 16 * Q6_K_BYTES;
/// Where the Q4_K code pieces start in a group block.
pub(crate) const Q4_K_CODES_AT: usize = 256;
/// Where the Q6_K scales start in a group block.
pub(crate) const Q6_K_SCALES_AT: usize = 32;
/// Where the Q6_K code pieces start in a group block.
pub(crate) const Q6_K_CODES_AT: usize = 288;
/// Bytes of one Q6_K code piece (32 values of 16 rows).
pub(crate) const Q6_K_PIECE_BYTES: usize = 384;

/// Row `k`'s 6-bit scales and minimums of a Q4_K super-block, from its 12 packed bytes (as
/// ggml's `get_scale_min_k4`).
fn q4_k_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0F) | (s[j] >> 6) << 4;
        m[j + 4] = (s[j + 8] >> 4) | (s[j + 4] >> 6) << 4;
    }
    (sc, m)
}

/// The 12 packed bytes of Q4_K scales and minimums: the inverse of [`q4_k_scales`].
fn q4_k_pack_scales(sc: &[u8; 8], m: &[u8; 8], s: &mut [u8]) {
    for j in 0..4 {
        s[j] = sc[j] | (sc[j + 4] >> 4) << 6;
        s[j + 4] = m[j] | (m[j + 4] >> 4) << 6;
        s[j + 8] = (sc[j + 4] & 0x0F) | (m[j + 4] & 0x0F) << 4;
    }
}

/// Writes 32 codes (each < 16) of row `k` as its lanes of four nibble vectors at `dst`.
fn put_nibbles(k: usize, codes: &[u8; 32], dst: &mut [u8]) {
    for j in 0..4 {
        for b in 0..4 {
            dst[64 * j + 4 * k + b] = codes[4 * j + b] | codes[16 + 4 * j + b] << 4;
        }
    }
}

/// Row `k`'s 32 codes back from its lanes of four nibble vectors at `src`.
fn get_nibbles(k: usize, src: &[u8]) -> [u8; 32] {
    let mut codes = [0u8; 32];
    for j in 0..4 {
        for b in 0..4 {
            let byte = src[64 * j + 4 * k + b];
            codes[4 * j + b] = byte & 0x0F;
            codes[16 + 4 * j + b] = byte >> 4;
        }
    }
    codes
}

/// Writes row `k`'s Q4_K file super-block `blk` into the group block `dst`.
pub(crate) fn pack_q4_k(k: usize, blk: &[u8], dst: &mut [u8]) {
    pack_k4_header(k, blk, dst);
    let qs = &blk[16..144];
    for p in 0..8 {
        // Sub-block p: the low (even p) or high (odd p) nibbles of qs[32·(p/2)..][..32].
        let chunk = &qs[32 * (p / 2)..32 * (p / 2) + 32];
        let codes: [u8; 32] = std::array::from_fn(|l| (chunk[l] >> (4 * (p % 2))) & 0x0F);
        put_nibbles(k, &codes, &mut dst[Q4_K_CODES_AT + 256 * p..]);
    }
}

/// Row `k`'s Q4_K file super-block, read back from the group block `src`, into `out`.
pub(crate) fn unpack_q4_k(k: usize, src: &[u8], out: &mut [u8]) {
    unpack_k4_header(k, src, out);
    let qs = &mut out[16..144];
    qs.fill(0);
    for p in 0..8 {
        let codes = get_nibbles(k, &src[Q4_K_CODES_AT + 256 * p..]);
        for (q, c) in qs[32 * (p / 2)..32 * (p / 2) + 32].iter_mut().zip(codes) {
            *q |= c << (4 * (p % 2));
        }
    }
}

/// Row `k`'s `d`, `dmin`, scales and minimums (the first 16 bytes of a Q4_K or Q5_K file
/// super-block) into the 256-byte header of a group block.
fn pack_k4_header(k: usize, blk: &[u8], dst: &mut [u8]) {
    dst[2 * k..2 * k + 2].copy_from_slice(&blk[0..2]);
    dst[32 + 2 * k..32 + 2 * k + 2].copy_from_slice(&blk[2..4]);
    let (sc, m) = q4_k_scales(&blk[4..16]);
    for j in 0..8 {
        dst[64 + 16 * j + k] = sc[j] | (m[j] >> 4) << 6;
        dst[192 + 16 * (j % 4) + k] |= (m[j] & 0x0F) << (4 * (j / 4));
    }
}

/// The inverse of [`pack_k4_header`]: row `k`'s first 16 file bytes.
fn unpack_k4_header(k: usize, src: &[u8], out: &mut [u8]) {
    out[0..2].copy_from_slice(&src[2 * k..2 * k + 2]);
    out[2..4].copy_from_slice(&src[32 + 2 * k..32 + 2 * k + 2]);
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        let byte = src[64 + 16 * j + k];
        sc[j] = byte & 63;
        m[j] = (byte >> 6) << 4 | (src[192 + 16 * (j % 4) + k] >> (4 * (j / 4))) & 0x0F;
    }
    q4_k_pack_scales(&sc, &m, &mut out[4..16]);
}

/// Writes row `k`'s Q5_K file super-block `blk` into the group block `dst` (zeroed before its
/// first row): the Q4_K header and nibbles, and after each piece's nibbles its fifth bits as
/// eight 64-bit masks (bit `4k + b` of mask `i` is row `k`'s bit of code `4i + b`, as Q5_0's masks).
pub(crate) fn pack_q5_k(k: usize, blk: &[u8], dst: &mut [u8]) {
    pack_k4_header(k, blk, dst);
    let (qh, qs) = (&blk[16..48], &blk[48..176]);
    for p in 0..8 {
        let chunk = &qs[32 * (p / 2)..32 * (p / 2) + 32];
        let codes: [u8; 32] = std::array::from_fn(|l| (chunk[l] >> (4 * (p % 2))) & 0x0F);
        let piece = &mut dst[Q5_K_CODES_AT + Q5_K_PIECE_BYTES * p..][..Q5_K_PIECE_BYTES];
        put_nibbles(k, &codes, piece);
        for (e, &h) in qh.iter().enumerate() {
            if h >> p & 1 == 1 {
                let (i, bit) = (e / 4, 4 * k + e % 4);
                piece[256 + 8 * i + bit / 8] |= 1 << (bit % 8);
            }
        }
    }
}

/// Row `k`'s Q5_K file super-block, read back from the group block `src`, into `out`.
pub(crate) fn unpack_q5_k(k: usize, src: &[u8], out: &mut [u8]) {
    unpack_k4_header(k, src, out);
    out[16..176].fill(0);
    for p in 0..8 {
        let piece = &src[Q5_K_CODES_AT + Q5_K_PIECE_BYTES * p..][..Q5_K_PIECE_BYTES];
        let codes = get_nibbles(k, piece);
        for (l, c) in codes.into_iter().enumerate() {
            out[48 + 32 * (p / 2) + l] |= c << (4 * (p % 2));
            let (i, bit) = (l / 4, 4 * k + l % 4);
            let high = piece[256 + 8 * i + bit / 8] >> (bit % 8) & 1;
            out[16 + l] |= high << p;
        }
    }
}

/// Row `k`'s 256 six-bit Q6_K codes (value + 32) from its file super-block.
fn q6_k_codes(blk: &[u8]) -> [u8; 256] {
    let (ql, qh) = (&blk[0..128], &blk[128..192]);
    std::array::from_fn(|e| {
        let (n, q, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = (ql[64 * n + 32 * (q % 2) + l] >> (4 * (q / 2))) & 0x0F;
        let high = (qh[32 * n + l] >> (2 * q)) & 3;
        low | high << 4
    })
}

/// Writes row `k`'s Q6_K file super-block `blk` into the group block `dst` (zeroed before its
/// first row).
pub(crate) fn pack_q6_k(k: usize, blk: &[u8], dst: &mut [u8]) {
    dst[2 * k..2 * k + 2].copy_from_slice(&blk[208..210]);
    for s in 0..16 {
        dst[Q6_K_SCALES_AT + 16 * s + k] = blk[192 + s];
    }
    let codes = q6_k_codes(blk);
    for p in 0..8 {
        let piece = &mut dst[Q6_K_CODES_AT + Q6_K_PIECE_BYTES * p..][..Q6_K_PIECE_BYTES];
        let c: [u8; 32] = std::array::from_fn(|l| codes[32 * p + l]);
        put_nibbles(k, &c.map(|x| x & 0x0F), piece);
        for h in 0..2 {
            for i in 0..4 {
                for b in 0..4 {
                    piece[256 + 64 * h + 4 * k + b] |= (c[16 * h + 4 * i + b] >> 4) << (2 * i);
                }
            }
        }
    }
}

/// Row `k`'s Q6_K file super-block, read back from the group block `src`, into `out`.
pub(crate) fn unpack_q6_k(k: usize, src: &[u8], out: &mut [u8]) {
    out[208..210].copy_from_slice(&src[2 * k..2 * k + 2]);
    for s in 0..16 {
        out[192 + s] = src[Q6_K_SCALES_AT + 16 * s + k];
    }
    out[0..192].fill(0);
    for p in 0..8 {
        let piece = &src[Q6_K_CODES_AT + Q6_K_PIECE_BYTES * p..][..Q6_K_PIECE_BYTES];
        let low = get_nibbles(k, piece);
        for (l, &lo) in low.iter().enumerate() {
            let (h, i, b) = (l / 16, (l % 16) / 4, l % 4);
            let high = (piece[256 + 64 * h + 4 * k + b] >> (2 * i)) & 3;
            let e = 32 * p + l;
            let (n, q, at) = (e / 128, (e % 128) / 32, e % 32);
            out[64 * n + 32 * (q % 2) + at] |= lo << (4 * (q / 2));
            out[128 + 32 * n + at] |= high << (2 * q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::bytes;

    #[test]
    fn q4_k_scales_round_trip() {
        let s = bytes(12, 3);
        let (sc, m) = q4_k_scales(&s);
        let mut back = [0u8; 12];
        q4_k_pack_scales(&sc, &m, &mut back);
        assert_eq!(back[..], s[..]);
    }

    #[test]
    fn super_blocks_round_trip_through_every_lane() {
        for (bytes_per, pack, unpack) in [
            (
                Q4_K_BYTES,
                pack_q4_k as fn(usize, &[u8], &mut [u8]),
                unpack_q4_k as fn(_, &_, &mut _),
            ),
            (Q5_K_BYTES, pack_q5_k, unpack_q5_k),
            (Q6_K_BYTES, pack_q6_k, unpack_q6_k),
        ] {
            let file = bytes(16 * bytes_per, bytes_per as u32);
            let mut group = vec![0u8; 16 * bytes_per];
            for (k, blk) in file.chunks_exact(bytes_per).enumerate() {
                pack(k, blk, &mut group);
            }
            for (k, blk) in file.chunks_exact(bytes_per).enumerate() {
                let mut out = vec![0xAAu8; bytes_per];
                unpack(k, &group, &mut out);
                assert_eq!(out, blk, "{bytes_per}-byte blocks, row {k}");
            }
        }
    }
}
