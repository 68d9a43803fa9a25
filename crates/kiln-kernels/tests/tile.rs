//! Token tiles (prefill): at every level the CPU supports, each tile result equals the scalar
//! reference exactly on integer-valued data and is within 1e-5 of Σ|terms| of it on random
//! scales (the magnitude each kernel's f32 rounding is relative to); tiles that keep their
//! row kernel's arithmetic are also checked bit for bit against it. Token counts that leave a
//! ragged last tile are covered both through `vec_dot_tile_at` and through the matmul driver.

mod common;

use common::*;
use kiln_kernels::*;

/// Types with SIMD tile kernels, then two that take the per-token fallback.
const TYPES: [GgmlType; 7] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q4_0,
    GgmlType::Q5_K,
];

/// Whether (`level`, `ty`)'s tile does its row kernel's arithmetic in the same order (all but
/// the AVX-512 Q8_0 / Q5_0 tiles, which read interleaved activations).
fn tile_is_row_exact(level: CpuLevel, ty: GgmlType) -> bool {
    !(level == CpuLevel::Avx512 && matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0))
}

/// Token counts: below, at and past one tile, with ragged last tiles of 1, 3 and 4 tokens.
const TOKENS: [usize; 8] = [1, 2, 3, 7, 8, 9, 12, 19];

/// Owned activation rows of the format `ty` pairs with.
enum Acts {
    Q8_0(Vec<Vec<BlockQ8_0>>),
    Q8_1(Vec<Vec<BlockQ8_1>>),
    Q8K(Vec<Vec<BlockQ8K>>),
}

impl Acts {
    fn random(rng: &mut Rng, ty: GgmlType, n_elems: usize, n_rows: usize, unit: bool) -> Acts {
        match ActFormat::for_weight(ty).unwrap() {
            ActFormat::Q8_0 => Acts::Q8_0(
                (0..n_rows)
                    .map(|_| random_q8_0(rng, n_elems / 32, unit))
                    .collect(),
            ),
            ActFormat::Q8_1 => Acts::Q8_1(
                (0..n_rows)
                    .map(|_| random_q8_1(rng, n_elems / 32, unit))
                    .collect(),
            ),
            ActFormat::Q8K => Acts::Q8K(
                (0..n_rows)
                    .map(|_| random_q8k(rng, n_elems / 256, unit))
                    .collect(),
            ),
            ActFormat::F32 => unreachable!("quantized types only"),
        }
    }

    fn rows(&self) -> Vec<ActRow<'_>> {
        match self {
            Acts::Q8_0(v) => v.iter().map(|r| ActRow::Q8_0(r)).collect(),
            Acts::Q8_1(v) => v.iter().map(|r| ActRow::Q8_1(r)).collect(),
            Acts::Q8K(v) => v.iter().map(|r| ActRow::Q8K(r)).collect(),
        }
    }

    /// Row `t` dequantized (the values the dot product sees).
    fn values(&self, t: usize) -> Vec<f32> {
        act_values(Some(self.rows()[t]))
    }
}

/// The scale for float tolerances: Σ|w·a| of each part a kernel sums separately (scale and
/// minimum parts for Q4_1/Q4_K/Q5_K, the unsigned codes and the offset of 32 for Q6_K), since
/// the f32 roundings are relative to those, not to the result after they cancel.
fn magnitude(ty: GgmlType, w: &[u8], a: &[f32]) -> f64 {
    let abs_dot = |w: &[u8]| {
        let mut wd = vec![0.0f32; a.len()];
        dequantize_row(ty, w, &mut wd).unwrap();
        wd.iter()
            .zip(a)
            .map(|(&x, &y)| (x as f64 * y as f64).abs())
            .sum::<f64>()
    };
    let with = |edit: &dyn Fn(&mut [u8])| {
        let mut c = w.to_vec();
        c.chunks_exact_mut(ty.block_bytes()).for_each(edit);
        abs_dot(&c)
    };
    match ty {
        GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
            with(&|b| b[2..4].fill(0)) + with(&|b| b[0..2].fill(0))
        }
        GgmlType::Q6_K => abs_dot(w) + with(&|b| b[..192].fill(0)),
        _ => abs_dot(w),
    }
}

fn block_counts(ty: GgmlType) -> &'static [usize] {
    // Odd counts leave the AVX-512 pair kernels a trailing single block.
    if ty.block_elems() == 256 {
        &[1, 2, 3]
    } else {
        &[1, 3, 18]
    }
}

#[test]
fn tiles_equal_the_scalar_reference_exactly_on_integer_data() {
    let mut rng = Rng::new(31);
    for ty in TYPES {
        for &nb in block_counts(ty) {
            let n = nb * ty.block_elems();
            let w = random_row(&mut rng, ty, n, true);
            for n_tok in TOKENS {
                let acts = Acts::random(&mut rng, ty, n, n_tok, true);
                let rows = acts.rows();
                for level in supported_levels() {
                    let mut out = vec![f32::NAN; n_tok];
                    vec_dot_tile_at(level, ty, &w, &rows, &mut out).unwrap();
                    for (t, (&got, &a)) in out.iter().zip(&rows).enumerate() {
                        let want = vec_dot_at(CpuLevel::Scalar, ty, &w, a).unwrap();
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{ty} nb={nb} n={n_tok} t={t} {level:?}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn tiles_match_row_kernels_bitwise_and_scalar_within_tolerance() {
    let mut rng = Rng::new(32);
    for ty in TYPES {
        for &nb in block_counts(ty) {
            let n = nb * ty.block_elems();
            let w = random_row(&mut rng, ty, n, false);
            for n_tok in TOKENS {
                let acts = Acts::random(&mut rng, ty, n, n_tok, false);
                let rows = acts.rows();
                for level in supported_levels() {
                    let mut out = vec![f32::NAN; n_tok];
                    vec_dot_tile_at(level, ty, &w, &rows, &mut out).unwrap();
                    for (t, (&got, &a)) in out.iter().zip(&rows).enumerate() {
                        let row = vec_dot_at(level, ty, &w, a).unwrap();
                        if tile_is_row_exact(level, ty) {
                            assert_eq!(
                                got.to_bits(),
                                row.to_bits(),
                                "{ty} nb={nb} t={t} {level:?}"
                            );
                        }
                        let scalar = vec_dot_at(CpuLevel::Scalar, ty, &w, a).unwrap();
                        let tol = 1e-5 * magnitude(ty, &w, &acts.values(t)) + 1e-30;
                        assert!(
                            (got as f64 - scalar as f64).abs() <= tol,
                            "{ty} nb={nb} n={n_tok} t={t} {level:?}: {got} vs {scalar}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn vec_dot_tile_validates_inputs() {
    let mut rng = Rng::new(33);
    let w = random_row(&mut rng, GgmlType::Q8_0, 64, false);
    let a = random_q8_0(&mut rng, 2, false);
    let short = random_q8_0(&mut rng, 1, false);
    let a1 = random_q8_1(&mut rng, 2, false);
    let mut out = [0.0f32; 2];
    let ok = [ActRow::Q8_0(&a), ActRow::Q8_0(&a)];
    assert!(vec_dot_tile_at(CpuLevel::Avx512, GgmlType::Q8_0, &w, &ok, &mut out).is_ok());
    assert!(vec_dot_tile_at(CpuLevel::Scalar, GgmlType::Q8_0, &w, &ok, &mut out[..1]).is_err());
    let bad_len = [ActRow::Q8_0(&a), ActRow::Q8_0(&short)];
    assert!(vec_dot_tile_at(CpuLevel::Scalar, GgmlType::Q8_0, &w, &bad_len, &mut out).is_err());
    let bad_fmt = [ActRow::Q8_0(&a), ActRow::Q8_1(&a1)];
    assert!(matches!(
        vec_dot_tile_at(CpuLevel::Scalar, GgmlType::Q8_0, &w, &bad_fmt, &mut out),
        Err(KernelError::ActivationMismatch { .. })
    ));
}

/// The matmul driver at every level: rows split over several pool tasks (70 rows, the last
/// task short) and token counts with a ragged last tile; each result within 1e-5 of the
/// tolerance magnitude of the scalar reference, and bit-identical to that level's row kernel
/// where the tile keeps its arithmetic.
/// Dequantized values of an activation row.
fn act_values(r: Option<ActRow<'_>>) -> Vec<f32> {
    match r.unwrap() {
        ActRow::Q8_0(v) => v
            .iter()
            .flat_map(|b| b.qs.map(|q| b.d.to_f32() * q as f32))
            .collect(),
        ActRow::Q8_1(v) => v
            .iter()
            .flat_map(|b| b.qs.map(|q| b.d.to_f32() * q as f32))
            .collect(),
        ActRow::Q8K(v) => v
            .iter()
            .flat_map(|b| b.qs.map(|q| b.d * q as f32))
            .collect(),
        ActRow::F32(v) => v.to_vec(),
    }
}

#[test]
fn matmul_tiles_every_level_with_ragged_tiles() {
    let mut rng = Rng::new(34);
    for ty in TYPES {
        let (rows, cols) = (
            70,
            if ty.block_elems() == 256 {
                512
            } else {
                17 * 32
            },
        );
        let data: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(&mut rng, ty, cols, false))
            .collect();
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        for n_tokens in [2, 5, 9, 11, 16, 17] {
            let x: Vec<f32> = (0..n_tokens * cols).map(|_| rng.sym()).collect();
            let mut qa = QuantizedActivations::new();
            qa.quantize_rows_into(ty, &x, n_tokens).unwrap();
            let values: Vec<Vec<f32>> = (0..n_tokens).map(|t| act_values(qa.row(t))).collect();
            for level in supported_levels() {
                let mut out = vec![f32::NAN; rows * n_tokens];
                let mut scratch = QuantizedActivations::new();
                matmul_at(level, &w, &x, n_tokens, &mut out, &mut scratch).unwrap();
                for t in 0..n_tokens {
                    let act = qa.row(t).unwrap();
                    for r in 0..rows {
                        let got = out[t * rows + r];
                        let row = vec_dot_at(level, ty, w.row(r).unwrap(), act).unwrap();
                        if tile_is_row_exact(level, ty) {
                            assert_eq!(got.to_bits(), row.to_bits(), "{ty} {level:?} r={r} t={t}");
                        }
                        let want =
                            vec_dot_at(CpuLevel::Scalar, ty, w.row(r).unwrap(), act).unwrap();
                        let tol = 1e-5 * magnitude(ty, w.row(r).unwrap(), &values[t]) + 1e-30;
                        assert!(
                            (got as f64 - want as f64).abs() <= tol,
                            "{ty} {level:?} n={n_tokens} r={r} t={t}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// Speed of the tiles against one row dot per token, on one thread, through the matmul
/// driver: 64 tokens at once (tiles) against 64 one-token calls (row kernels), at the SmolLM2
/// shapes (`ffn_up` 1536 × 576 and `ffn_down` 576 × 1536; K-quants only fit the latter), best
/// of 5. Run: `cargo test -p kiln-kernels --release --test tile -- --ignored
/// --nocapture` (`KILN_BENCH_TYPE=Q8_0` / `KILN_BENCH_LEVEL=avx512` for one type / level, and
/// `KILN_BENCH_TILES_ONLY=1` for 50 tile runs without the row dots, e.g. under `perf record`).
#[test]
#[ignore]
fn bench_tiles() {
    kiln_kernels::pool::set_threads(1);
    let tiles_only = std::env::var("KILN_BENCH_TILES_ONLY").is_ok();
    let mut rng = Rng::new(35);
    let n_tok = 64;
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        if std::env::var("KILN_BENCH_TYPE").is_ok_and(|v| v != ty.to_string()) {
            continue;
        }
        let shapes: &[(usize, usize)] = if ty.block_elems() == 256 {
            &[(576, 1536)]
        } else {
            &[(1536, 576), (576, 1536)]
        };
        for &(rows, cols) in shapes {
            let data: Vec<u8> = (0..rows)
                .flat_map(|_| random_row(&mut rng, ty, cols, false))
                .collect();
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.sym()).collect();
            let mut out = vec![0.0f32; rows * n_tok];
            let mut s = QuantizedActivations::new();
            for level in supported_levels() {
                if std::env::var("KILN_BENCH_LEVEL").is_ok_and(|v| v != level.name()) {
                    continue;
                }
                let mut time = |f: &mut dyn FnMut(&mut [f32], &mut QuantizedActivations)| {
                    (0..5)
                        .map(|_| {
                            let t0 = std::time::Instant::now();
                            f(&mut out, &mut s);
                            t0.elapsed().as_secs_f64()
                        })
                        .fold(f64::INFINITY, f64::min)
                };
                let macs = (rows * cols * n_tok) as f64;
                if tiles_only {
                    // A long run of the tile path alone, for a profiler.
                    let tile = time(&mut |out, s| {
                        for _ in 0..50 {
                            matmul_at(level, &w, &x, n_tok, out, s).unwrap();
                        }
                    }) / 50.0;
                    println!(
                        "{ty} {rows}x{cols} {level:?}: tiles {:.2} GMAC/s",
                        macs / tile / 1e9
                    );
                    continue;
                }
                let row = time(&mut |out, s| {
                    for (xt, ot) in x.chunks_exact(cols).zip(out.chunks_exact_mut(rows)) {
                        matmul_at(level, &w, xt, 1, ot, s).unwrap();
                    }
                });
                let tile = time(&mut |out, s| matmul_at(level, &w, &x, n_tok, out, s).unwrap());
                println!(
                    "{ty} {rows}x{cols} x {n_tok} tokens {level:?}: row dots {:.2} GMAC/s, tiles {:.2} GMAC/s ({:.2}x)",
                    macs / row / 1e9,
                    macs / tile / 1e9,
                    row / tile
                );
            }
        }
    }
}
