//! Deterministic test data shared by the kernel tests.

/// A xorshift32 stream from `seed` (which must not be 0).
pub(crate) fn xorshift(seed: u32) -> impl FnMut() -> u32 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    }
}

/// `n` values in [−10, 10) with three decimals, from `seed`.
pub(crate) fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut next = xorshift(seed);
    (0..n)
        .map(|_| (next() % 20_000) as f32 / 1000.0 - 10.0)
        .collect()
}

/// `n` bytes from `seed`.
pub(crate) fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut next = xorshift(seed);
    (0..n).map(|_| next() as u8).collect()
}
