//! Matmul driver: results equal per-row `vec_dot`, shapes are validated, scratch is reused.

mod common;

use common::*;
use kiln_kernels::*;

/// Checks `matmul` against per-row `vec_dot` at the process's level: bit for bit, except for
/// several tokens through the AVX-512 Q8_0 / Q5_0 tiles, whose interleaved summation order
/// differs from the row kernel's (there: 1e-5 of Σ|terms|; `tests/tile.rs` covers them).
fn check_matmul(ty: GgmlType, rows: usize, cols: usize, n_tokens: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let data: Vec<u8> = (0..rows)
        .flat_map(|_| random_row(&mut rng, ty, cols, false))
        .collect();
    let w = QMatrix::new(ty, rows, cols, &data).unwrap();
    let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.sym()).collect();
    let mut out = vec![f32::NAN; rows * n_tokens];
    let mut scratch = QuantizedActivations::new();
    matmul(&w, &x, n_tokens, &mut out, &mut scratch).unwrap();
    let mut qa = QuantizedActivations::new();
    for t in 0..n_tokens {
        qa.quantize_into(ty, &x[t * cols..(t + 1) * cols]).unwrap();
        for r in 0..rows {
            let act = qa.row(0).unwrap();
            let want = vec_dot(ty, w.row(r).unwrap(), act).unwrap();
            let got = out[t * rows + r];
            // Several tokens of float weights go through register blocks (one accumulator per
            // lane, summed at the end), not the row dot's order.
            let float_blocks = n_tokens > 1 && cpu_level() >= CpuLevel::Avx2 && ty.is_float();
            let interleaved = float_blocks
                || n_tokens > 1
                    && cpu_level() == CpuLevel::Avx512
                    && matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0);
            if interleaved {
                let mut wd = vec![0.0f32; cols];
                dequantize_row(ty, w.row(r).unwrap(), &mut wd).unwrap();
                let acts: Vec<f32> = match act {
                    ActRow::Q8_0(blocks) => blocks
                        .iter()
                        .flat_map(|b| b.qs.map(|q| b.d.to_f32() * q as f32))
                        .collect(),
                    ActRow::F32(x) => x.to_vec(),
                    _ => panic!("unexpected activation format"),
                };
                let mag: f64 = wd
                    .iter()
                    .zip(acts)
                    .map(|(&x, y)| (x as f64 * y as f64).abs())
                    .sum();
                assert!(
                    (got as f64 - want as f64).abs() <= 1e-5 * mag,
                    "{ty} r={r} t={t}"
                );
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{ty} r={r} t={t}");
            }
        }
    }
}

#[test]
fn matmul_equals_rowwise_dot() {
    check_matmul(GgmlType::Q4_1, 576, 576, 1, 1);
    check_matmul(GgmlType::Q4_1, 200, 1536, 13, 2);
    check_matmul(GgmlType::Q8_0, 130, 576, 3, 3);
    check_matmul(GgmlType::Q4_0, 65, 96, 9, 4);
    check_matmul(GgmlType::Q5_0, 70, 64, 2, 5);
    check_matmul(GgmlType::Q5_1, 70, 64, 2, 6);
    check_matmul(GgmlType::Q4_K, 100, 512, 3, 7);
    check_matmul(GgmlType::Q6_K, 100, 256, 2, 8);
    check_matmul(GgmlType::Q5_K, 70, 768, 3, 16);
    check_matmul(GgmlType::Q3_K, 70, 512, 2, 17);
    check_matmul(GgmlType::Q2_K, 70, 512, 2, 18);
    check_matmul(GgmlType::F16, 129, 40, 3, 9);
    check_matmul(GgmlType::F16, 130, 771, 13, 12);
    check_matmul(GgmlType::F32, 129, 40, 3, 10);
    check_matmul(GgmlType::F32, 67, 300, 8, 13);
    check_matmul(GgmlType::BF16, 70, 100, 7, 14);
    check_matmul(GgmlType::BF16, 3, 40, 1, 11);
}

/// `matmul_f32` at every level, one token (row dots) and several (token tiles, with ragged
/// last tiles and columns that leave a scalar tail): within 1e-5 of Σ|w·x| of the exact f64
/// dot product.
#[test]
fn matmul_f32_matches_scalar() {
    let mut rng = Rng::new(12);
    for (rows, cols) in [(150, 77), (40, 576)] {
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.sym()).collect();
        for n in [1, 2, 5, 8, 9, 17] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.sym()).collect();
            for level in supported_levels() {
                let mut out = vec![f32::NAN; rows * n];
                matmul_f32_at(level, &w, rows, cols, &x, n, &mut out).unwrap();
                for t in 0..n {
                    for r in 0..rows {
                        let terms =
                            (0..cols).map(|k| w[r * cols + k] as f64 * x[t * cols + k] as f64);
                        let exact: f64 = terms.clone().sum();
                        let mag: f64 = terms.map(f64::abs).sum();
                        let got = out[t * rows + r] as f64;
                        assert!(
                            (got - exact).abs() <= 1e-5 * mag,
                            "{level:?} {rows}x{cols} n={n} r={r} t={t}: {got} vs {exact}"
                        );
                    }
                }
            }
        }
        let x = vec![0.0; 5 * cols];
        let mut out = vec![0.0; rows * 5];
        assert!(matmul_f32(&w, rows, cols, &x, 5, &mut out[1..]).is_err());
        assert!(matmul_f32(&w[1..], rows, cols, &x, 5, &mut out).is_err());
    }
}

/// A token's `matmul_f32` result is the same bits alone and among others (any tile position,
/// ragged tiles), at every level: a decoding sequence's numbers do not depend on its batch.
#[test]
fn matmul_f32_rows_do_not_depend_on_the_batch() {
    let mut rng = Rng::new(13);
    let (rows, cols) = (40, 576);
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.sym()).collect();
    let n = 11;
    let x: Vec<f32> = (0..n * cols).map(|_| rng.sym()).collect();
    for level in supported_levels() {
        let mut all = vec![0.0; rows * n];
        matmul_f32_at(level, &w, rows, cols, &x, n, &mut all).unwrap();
        for t in 0..n {
            let mut one = vec![0.0; rows];
            matmul_f32_at(
                level,
                &w,
                rows,
                cols,
                &x[t * cols..(t + 1) * cols],
                1,
                &mut one,
            )
            .unwrap();
            let same = one
                .iter()
                .zip(&all[t * rows..(t + 1) * rows])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{level:?}: token {t} alone differs from in the batch");
        }
    }
}

/// Speed of `matmul_f32` with 64 tokens (tiles) against 64 one-token calls (row dots), one
/// thread, 576 × 576 and 1536 × 576. Run: `cargo test -p kiln-kernels --release --test matmul
/// -- --ignored --nocapture bench_matmul_f32`.
#[test]
#[ignore]
fn bench_matmul_f32() {
    kiln_kernels::pool::set_threads(1);
    let mut rng = Rng::new(16);
    for (rows, cols) in [(576, 576), (1536, 576)] {
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.sym()).collect();
        let n = 64;
        let x: Vec<f32> = (0..n * cols).map(|_| rng.sym()).collect();
        let mut out = vec![0.0; rows * n];
        for level in supported_levels() {
            let best = |f: &mut dyn FnMut()| {
                (0..5)
                    .map(|_| {
                        let t0 = std::time::Instant::now();
                        f();
                        t0.elapsed().as_secs_f64()
                    })
                    .fold(f64::INFINITY, f64::min)
            };
            let row = best(&mut || {
                for (xt, ot) in x.chunks_exact(cols).zip(out.chunks_exact_mut(rows)) {
                    matmul_f32_at(level, &w, rows, cols, xt, 1, ot).unwrap();
                }
            });
            let tile = best(&mut || matmul_f32_at(level, &w, rows, cols, &x, n, &mut out).unwrap());
            let macs = (rows * cols * n) as f64;
            println!(
                "f32 {rows}x{cols} x {n} tokens {level:?}: row dots {:.2} GFLOP/s, tiles {:.2} GFLOP/s ({:.2}x)",
                2.0 * macs / row / 1e9,
                2.0 * macs / tile / 1e9,
                row / tile
            );
        }
    }
}

#[test]
fn qmatrix_and_matmul_validate_shapes() {
    let data = vec![0u8; 20 * 4];
    assert!(QMatrix::new(GgmlType::Q4_1, 2, 64, &data).is_ok());
    assert!(QMatrix::new(GgmlType::Q4_1, 3, 64, &data).is_err());
    assert!(QMatrix::new(GgmlType::Q4_1, 4, 33, &data).is_err());
    assert!(matches!(
        QMatrix::new(GgmlType::Q4_1, usize::MAX, 64, &data),
        Err(KernelError::Overflow(_))
    ));
    let w = QMatrix::new(GgmlType::Q4_1, 2, 64, &data).unwrap();
    let mut s = QuantizedActivations::new();
    let mut out = vec![0.0; 2];
    assert!(matmul(&w, &[0.0; 63], 1, &mut out, &mut s).is_err());
    assert!(matmul(&w, &[0.0; 64], 1, &mut out[..1], &mut s).is_err());
    assert!(matmul(&w, &[0.0; 64], 1, &mut out, &mut s).is_ok());
    assert_eq!(out, vec![0.0, 0.0]);
}

#[test]
fn dequantize_matrix_matches_rows() {
    let mut rng = Rng::new(13);
    let (rows, cols) = (5, 256);
    let data: Vec<u8> = (0..rows)
        .flat_map(|_| random_row(&mut rng, GgmlType::Q5_K, cols, false))
        .collect();
    let w = QMatrix::new(GgmlType::Q5_K, rows, cols, &data).unwrap();
    let all = dequantize_matrix(&w);
    for r in 0..rows {
        let mut row = vec![0.0; cols];
        dequantize_row(GgmlType::Q5_K, w.row(r).unwrap(), &mut row).unwrap();
        assert_eq!(&all[r * cols..(r + 1) * cols], &row[..]);
    }
}

#[test]
fn scratch_is_reused_without_reallocation() {
    let mut rng = Rng::new(14);
    let x: Vec<f32> = (0..4 * 576).map(|_| rng.sym()).collect();
    let mut s = QuantizedActivations::new();
    s.quantize_rows_into(GgmlType::Q4_1, &x, 4).unwrap();
    let p = s.row(0).map(|r| match r {
        ActRow::Q8_1(b) => b.as_ptr(),
        _ => panic!(),
    });
    s.quantize_rows_into(GgmlType::Q4_1, &x[..576], 1).unwrap();
    let q = s.row(0).map(|r| match r {
        ActRow::Q8_1(b) => b.as_ptr(),
        _ => panic!(),
    });
    assert_eq!(p, q);
    assert!(s.row(1).is_none());
    assert!(s.quantize_rows_into(GgmlType::Q4_K, &x[..576], 1).is_err());
}

/// Micro-benchmark of the Q4_1 × Q8_1 matmul at the model's FFN shape (1536 rows × 576 cols
/// and 576 × 1536). Run: `cargo test -p kiln-kernels --release --test matmul -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_q4_1_matmul() {
    let mut rng = Rng::new(15);
    for &(rows, cols) in &[(1536usize, 576usize), (576, 1536)] {
        let data: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(&mut rng, GgmlType::Q4_1, cols, false))
            .collect();
        let w = QMatrix::new(GgmlType::Q4_1, rows, cols, &data).unwrap();
        let mut s = QuantizedActivations::new();
        for &n in &[1usize, 16] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.sym()).collect();
            let mut out = vec![0.0; rows * n];
            matmul(&w, &x, n, &mut out, &mut s).unwrap();
            let iters = 2000 / n;
            let t0 = std::time::Instant::now();
            for _ in 0..iters {
                matmul(&w, &x, n, &mut out, &mut s).unwrap();
            }
            let dt = t0.elapsed().as_secs_f64() / iters as f64;
            println!(
                "Q4_1 {rows}x{cols} n_tokens={n} level={:?} threads={}: {:.1} us/call, {:.2} GB/s weights, {:.2} GMAC/s",
                cpu_level(),
                kiln_kernels::pool::global().threads(),
                dt * 1e6,
                data.len() as f64 / dt / 1e9,
                (rows * cols * n) as f64 / dt / 1e9
            );
        }
    }
}

/// The Q4_1 token tiles against the scalar reference, for every tile length 1..=8 and a ragged
/// last tile; bit-equality with the row kernel is covered above (other types: `tests/tile.rs`).
#[test]
fn tiled_prefill_matches_the_scalar_reference() {
    let (ty, rows, cols) = (GgmlType::Q4_1, 70, 17 * 32);
    let mut rng = Rng::new(21);
    let data: Vec<u8> = (0..rows)
        .flat_map(|_| random_row(&mut rng, ty, cols, false))
        .collect();
    let w = QMatrix::new(ty, rows, cols, &data).unwrap();
    for n_tokens in [2, 3, 5, 8, 11, 16] {
        let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.sym()).collect();
        let mut out = vec![f32::NAN; rows * n_tokens];
        matmul(&w, &x, n_tokens, &mut out, &mut QuantizedActivations::new()).unwrap();
        let mut qa = QuantizedActivations::new();
        for t in 0..n_tokens {
            qa.quantize_into(ty, &x[t * cols..(t + 1) * cols]).unwrap();
            for r in 0..rows {
                let want = vec_dot_at(CpuLevel::Scalar, ty, w.row(r).unwrap(), qa.row(0).unwrap())
                    .unwrap();
                let got = out[t * rows + r];
                assert!(
                    (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "n={n_tokens} r={r} t={t}: {got} vs {want}"
                );
            }
        }
    }
}
