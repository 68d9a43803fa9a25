//! Prefill attention loops at SmolLM2's shape (head width 64, 3 query heads per KV head, blocks
//! of 16 query rows: 48 query vectors), one 64-position key/value tile at a time, as
//! `attend_block` runs them: the transpose, the scores and the weighted sum, in multiply-adds
//! per nanosecond on one thread. Run: `cargo bench -p kiln-kernels --bench attention_block`.

use std::time::Instant;

use kiln_kernels::attention::block::{block_scores, block_weighted_sum, transpose_tile};
use kiln_kernels::attention::tile::Tile;

fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// Best-of-5 nanoseconds per call of `f`, over `reps` calls.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / reps as f64);
    }
    best
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("attention_block: a benchmark; run it with `cargo bench`");
        return;
    }
    let (hd, nq, len, n) = (64, 48, 64, 512);
    let q = noise(nq * hd, 1);
    let rows = noise(len * hd, 2);
    let weights = noise(nq * n, 3);
    let tile = Tile {
        rows: &rows,
        stride: hd,
        len,
        head_dim: hd,
    };
    let level = kiln_kernels::cpu_level();
    let mut kt = Vec::new();
    let ld = transpose_tile(level, tile, &mut kt);
    let mut scores = vec![0f32; nq * n];
    let mut out = vec![0f32; nq * hd];
    let macs = (nq * len * hd) as f64;
    let t_transpose = time(20_000, || {
        std::hint::black_box(transpose_tile(level, tile, &mut kt));
    });
    let t_scores = time(20_000, || {
        block_scores(level, &q, hd, (&kt, ld, len), 0.125, &mut scores, n, 64);
        std::hint::black_box(&scores);
    });
    let t_weighted = time(20_000, || {
        block_weighted_sum(level, &weights, n, 64, tile, &mut out);
        std::hint::black_box(&out);
    });
    println!("level {level:?}: {nq} query vectors x {len} positions x head width {hd}");
    println!("| step | ns per tile | multiply-adds per ns |");
    println!("| --- | ---: | ---: |");
    println!("| transpose | {t_transpose:.0} | |");
    println!("| scores | {t_scores:.0} | {:.1} |", macs / t_scores);
    println!(
        "| weighted sum | {t_weighted:.0} | {:.1} |",
        macs / t_weighted
    );
}
