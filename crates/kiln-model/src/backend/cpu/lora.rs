//! The CPU's LoRA delta (spec §8.4): `y += s·(x·A)·B` per token, beside the quantized base
//! matmul, in f32. A `[in, r]` is read row by row into `r` running sums (eight lanes at a time,
//! four interleaved partial sums so the adds do not wait on one another), the sums are scaled
//! by `s`, then B `[r, out]` is added into `y` 32 columns at a time, kept in registers across
//! B's rows: O((in + out)·r) per token, a few percent of the base matmul's work at the ranks
//! adapters use. With AVX2 the loops are FMA intrinsics (chosen at run time, `KILN_CPU_LEVEL`
//! honoured); the portable loops round each product, so the two differ in the last bits, but
//! a token's delta never depends on the other tokens of its call (decode and prefill, alone or
//! in a batch, give the same bits). A prefill chunk's tokens are split over the kernel pool; a
//! decoded token's modules that share an input (Q/K/V, gate/up) run as one dispatch of the
//! pool, a module per thread.

use kiln_kernels::CpuLevel;

use crate::lora::LoraModule;

/// Multiply-adds below which a chunk's tokens run on the calling thread. One module of one
/// decoded token is never split: spread over the pool (parts of `x·A`, then columns of `y`),
/// the 210 modules of a rank-8 SmolLM2 adapter took 0.90 ms a token against 0.81 ms on one
/// thread, two dispatches per module costing more than the second thread's bandwidth gives;
/// several modules of one input as one dispatch ([`add_deltas`]) do gain.
const MIN_PARALLEL_MACS: usize = 1 << 20;

/// `y += s·(x·A)·B` for the tokens of `x` (`[n, in]`) and `y` (`[n, out]`), shapes checked by
/// the caller.
pub(crate) fn add_delta(x: &[f32], y: &mut [f32], w: &LoraModule<'_>) {
    let (n_in, n_out) = (w.in_features, w.out_features);
    if n_in == 0 || n_out == 0 {
        return;
    }
    let n_tokens = x.len() / n_in;
    let level = kiln_kernels::cpu_level();
    if n_tokens > 1 && n_tokens * (n_in + n_out) * w.rank >= MIN_PARALLEL_MACS {
        kiln_kernels::pool::for_each_chunk_mut(y, n_out, 1, |t, yt| {
            token(level, &x[t * n_in..(t + 1) * n_in], yt, w)
        });
        return;
    }
    for (xt, yt) in x.chunks_exact(n_in).zip(y.chunks_exact_mut(n_out)) {
        token(level, xt, yt, w);
    }
}

/// One module's delta to add: the output rows (each job its own), the module, the input rows.
pub(crate) type DeltaJob<'a> = (std::sync::Mutex<&'a mut [f32]>, LoraModule<'a>, &'a [f32]);

/// Several modules' deltas on the same rows (Q/K/V, gate/up): one decoded token's run as one
/// dispatch of the pool, a module per task (each computed whole by one thread, as
/// [`add_delta`] computes it, so the same bits); more tokens go module by module, each split
/// over the pool by tokens when it is large enough.
pub(crate) fn add_deltas(jobs: &[DeltaJob<'_>]) {
    let macs: usize = jobs
        .iter()
        .map(|(_, w, x)| x.len() / w.in_features.max(1) * (w.in_features + w.out_features) * w.rank)
        .sum();
    let one = |(y, w, x): &DeltaJob<'_>| {
        let mut y = y.lock().unwrap_or_else(|p| p.into_inner());
        add_delta(x, &mut y, w);
    };
    if jobs.len() < 2 || macs >= MIN_PARALLEL_MACS {
        jobs.iter().for_each(one);
        return;
    }
    kiln_kernels::pool::parallel_for(jobs.len(), |i| one(&jobs[i]));
}

fn token(level: CpuLevel, x: &[f32], y: &mut [f32], w: &LoraModule<'_>) {
    #[cfg(target_arch = "x86_64")]
    if level >= CpuLevel::Avx2 {
        // SAFETY: `cpu_level()` reports AVX2 (which includes FMA here) only when the CPU has it.
        unsafe { x86::token(x, y, w) };
        return;
    }
    let _ = level;
    token_portable(x, y, w);
}

/// Ranks up to this keep `x·A` on the stack.
const STACK_RANK: usize = 64;

fn token_portable(x: &[f32], y: &mut [f32], w: &LoraModule<'_>) {
    let r = w.rank;
    let mut on_stack = [0f32; STACK_RANK];
    let mut on_heap = Vec::new();
    let xa: &mut [f32] = if r <= STACK_RANK {
        &mut on_stack[..r]
    } else {
        on_heap.resize(r, 0.0);
        &mut on_heap
    };
    down(x, w.a, r, xa);
    for (&v, b_row) in xa.iter().zip(w.b.chunks_exact(w.out_features)) {
        let c = w.scale * v;
        for (yo, bo) in y.iter_mut().zip(b_row) {
            *yo += c * bo;
        }
    }
}

/// `xa = x·A` with A `[x.len(), r]` row-major.
#[inline(always)]
fn down(x: &[f32], a: &[f32], r: usize, xa: &mut [f32]) {
    let n = x.len();
    let whole = n / 4 * 4;
    let mut j0 = 0;
    while j0 + 8 <= r {
        let mut acc = [[0f32; 8]; 4];
        for (i4, xs) in x[..whole].chunks_exact(4).enumerate() {
            for (k, (&xi, lanes)) in xs.iter().zip(acc.iter_mut()).enumerate() {
                let at = (i4 * 4 + k) * r + j0;
                let row: &[f32; 8] = a[at..at + 8].try_into().expect("eight lanes");
                for (l, v) in lanes.iter_mut().zip(row) {
                    *l += xi * v;
                }
            }
        }
        for (i, &xi) in x.iter().enumerate().skip(whole) {
            let at = i * r + j0;
            let row: &[f32; 8] = a[at..at + 8].try_into().expect("eight lanes");
            for (l, v) in acc[0].iter_mut().zip(row) {
                *l += xi * v;
            }
        }
        for l in 0..8 {
            xa[j0 + l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
        }
        j0 += 8;
    }
    for (j, out) in xa.iter_mut().enumerate().skip(j0) {
        let mut s = [0f32; 4];
        for (i4, xs) in x[..whole].chunks_exact(4).enumerate() {
            for (k, (&xi, sk)) in xs.iter().zip(s.iter_mut()).enumerate() {
                *sk += xi * a[(i4 * 4 + k) * r + j];
            }
        }
        for (i, &xi) in x.iter().enumerate().skip(whole) {
            s[0] += xi * a[i * r + j];
        }
        *out = (s[0] + s[1]) + (s[2] + s[3]);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::STACK_RANK;
    use crate::lora::LoraModule;

    /// One token's delta with AVX2 and FMA.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `x`, `y`, A and B must have the module's sizes.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn token(x: &[f32], y: &mut [f32], w: &LoraModule<'_>) {
        let r = w.rank;
        assert!(
            x.len() == w.in_features
                && y.len() == w.out_features
                && w.a.len() == w.in_features * r
                && w.b.len() == r * w.out_features,
            "LoRA delta shapes"
        );
        let mut on_stack = [0f32; STACK_RANK];
        let mut on_heap = Vec::new();
        let xa: &mut [f32] = if r <= STACK_RANK {
            &mut on_stack[..r]
        } else {
            on_heap.resize(r, 0.0);
            &mut on_heap
        };
        // SAFETY: the sizes were checked above; the CPU has AVX2 and FMA (this function's
        // contract).
        unsafe {
            down(x, w.a, r, xa);
        }
        for c in xa.iter_mut() {
            *c *= w.scale;
        }
        // SAFETY: as above.
        unsafe {
            up(xa, w.b, w.out_features, y);
        }
    }

    /// `xa = x·A`, A `[x.len(), r]` row-major: eight columns of A at a time (the last block
    /// masked when `r` is not a multiple of eight), four rows in flight (row `i` into partial
    /// sum `i % 4`, the rows past a multiple of four into the first), then the partial sums
    /// added pairwise.
    ///
    /// # Safety
    /// AVX2 and FMA; `a.len() == x.len() * r`, `xa.len() == r`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn down(x: &[f32], a: &[f32], r: usize, xa: &mut [f32]) {
        let n = x.len();
        let whole = n / 4 * 4;
        let (ap, xs) = (a.as_ptr(), x.as_ptr());
        let mut j0 = 0;
        while j0 < r {
            let lanes = (r - j0).min(8);
            let mask = _mm256_cmpgt_epi32(
                _mm256_set1_epi32(lanes as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            let (mut s0, mut s1, mut s2, mut s3) = (
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
            );
            let mut i = 0;
            if lanes == 8 {
                while i < whole {
                    // SAFETY: rows i..i+4 < n, columns j0..j0+8 <= r: inside A and x.
                    unsafe {
                        let p = ap.add(i * r + j0);
                        let xp = xs.add(i);
                        s0 = _mm256_fmadd_ps(_mm256_set1_ps(*xp), _mm256_loadu_ps(p), s0);
                        s1 = _mm256_fmadd_ps(
                            _mm256_set1_ps(*xp.add(1)),
                            _mm256_loadu_ps(p.add(r)),
                            s1,
                        );
                        s2 = _mm256_fmadd_ps(
                            _mm256_set1_ps(*xp.add(2)),
                            _mm256_loadu_ps(p.add(2 * r)),
                            s2,
                        );
                        s3 = _mm256_fmadd_ps(
                            _mm256_set1_ps(*xp.add(3)),
                            _mm256_loadu_ps(p.add(3 * r)),
                            s3,
                        );
                    }
                    i += 4;
                }
            } else {
                while i < whole {
                    // SAFETY: rows i..i+4 < n; the mask keeps columns j0..r.
                    unsafe {
                        let p = ap.add(i * r + j0);
                        let xp = xs.add(i);
                        s0 = _mm256_fmadd_ps(_mm256_set1_ps(*xp), _mm256_maskload_ps(p, mask), s0);
                        s1 = _mm256_fmadd_ps(
                            _mm256_set1_ps(*xp.add(1)),
                            _mm256_maskload_ps(p.add(r), mask),
                            s1,
                        );
                        s2 = _mm256_fmadd_ps(
                            _mm256_set1_ps(*xp.add(2)),
                            _mm256_maskload_ps(p.add(2 * r), mask),
                            s2,
                        );
                        s3 = _mm256_fmadd_ps(
                            _mm256_set1_ps(*xp.add(3)),
                            _mm256_maskload_ps(p.add(3 * r), mask),
                            s3,
                        );
                    }
                    i += 4;
                }
            }
            while i < n {
                // SAFETY: row i < n and columns j0..j0+lanes <= r are inside A; a masked load
                // reads only the lanes it keeps.
                let row = unsafe {
                    let p = ap.add(i * r + j0);
                    if lanes == 8 {
                        _mm256_loadu_ps(p)
                    } else {
                        _mm256_maskload_ps(p, mask)
                    }
                };
                s0 = _mm256_fmadd_ps(_mm256_set1_ps(x[i]), row, s0);
                i += 1;
            }
            let sum = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
            let mut out = [0f32; 8];
            // SAFETY: `out` holds eight floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
            xa[j0..j0 + lanes].copy_from_slice(&out[..lanes]);
            j0 += 8;
        }
    }

    /// `y += c·B` for `y.len()` columns of B, whose rows are `stride` apart starting at
    /// `b[0]`: 32 columns of `y` stay in registers while every row of B is added (fused), in
    /// row order.
    ///
    /// # Safety
    /// AVX2 and FMA; `b` holds `(c.len() - 1) * stride + y.len()` values.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn up(c: &[f32], b: &[f32], stride: usize, y: &mut [f32]) {
        let n_out = y.len();
        assert!(
            c.is_empty() || b.len() >= (c.len() - 1) * stride + n_out,
            "LoRA B columns"
        );
        let (bp, yp) = (b.as_ptr(), y.as_mut_ptr());
        let mut o = 0;
        while o + 32 <= n_out {
            // SAFETY: columns o..o+32 <= n_out of y and of every row of B.
            unsafe {
                let (mut a0, mut a1, mut a2, mut a3) = (
                    _mm256_loadu_ps(yp.add(o)),
                    _mm256_loadu_ps(yp.add(o + 8)),
                    _mm256_loadu_ps(yp.add(o + 16)),
                    _mm256_loadu_ps(yp.add(o + 24)),
                );
                let mut row = bp.add(o);
                for &cj in c {
                    let cv = _mm256_set1_ps(cj);
                    a0 = _mm256_fmadd_ps(cv, _mm256_loadu_ps(row), a0);
                    a1 = _mm256_fmadd_ps(cv, _mm256_loadu_ps(row.add(8)), a1);
                    a2 = _mm256_fmadd_ps(cv, _mm256_loadu_ps(row.add(16)), a2);
                    a3 = _mm256_fmadd_ps(cv, _mm256_loadu_ps(row.add(24)), a3);
                    row = row.add(stride);
                }
                _mm256_storeu_ps(yp.add(o), a0);
                _mm256_storeu_ps(yp.add(o + 8), a1);
                _mm256_storeu_ps(yp.add(o + 16), a2);
                _mm256_storeu_ps(yp.add(o + 24), a3);
            }
            o += 32;
        }
        while o + 8 <= n_out {
            // SAFETY: columns o..o+8 <= n_out.
            unsafe {
                let mut acc = _mm256_loadu_ps(yp.add(o));
                for (j, &cj) in c.iter().enumerate() {
                    let row = _mm256_loadu_ps(bp.add(j * stride + o));
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(cj), row, acc);
                }
                _mm256_storeu_ps(yp.add(o), acc);
            }
            o += 8;
        }
        for col in o..n_out {
            let mut acc = y[col];
            for (j, &cj) in c.iter().enumerate() {
                acc = cj.mul_add(b[j * stride + col], acc);
            }
            y[col] = acc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::LoraWeights;

    fn weights(n_in: usize, rank: usize, n_out: usize, seed: u64) -> LoraWeights {
        let mut state = seed | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        LoraWeights {
            in_features: n_in,
            out_features: n_out,
            rank,
            a: (0..n_in * rank).map(|_| next()).collect(),
            b: (0..rank * n_out).map(|_| next()).collect(),
            scale: 1.75,
        }
    }

    /// `s·(x·A)·B` in f64.
    fn exact(x: &[f32], w: &LoraWeights) -> Vec<f64> {
        let (n_in, r, n_out) = (w.in_features, w.rank, w.out_features);
        let mut out = Vec::new();
        for xt in x.chunks_exact(n_in) {
            let xa: Vec<f64> = (0..r)
                .map(|j| {
                    (0..n_in)
                        .map(|i| xt[i] as f64 * w.a[i * r + j] as f64)
                        .sum()
                })
                .collect();
            for o in 0..n_out {
                let d: f64 = (0..r).map(|j| xa[j] * w.b[j * n_out + o] as f64).sum();
                out.push(w.scale as f64 * d);
            }
        }
        out
    }

    #[test]
    fn the_delta_matches_f64_at_every_rank_shape_and_level_split_or_not() {
        // Ranks below, at and past a lane block, widths with and without a ragged quarter.
        for (n_in, rank, n_out, tokens) in [
            (576, 8, 192, 1),
            (37, 3, 5, 2),
            (64, 16, 64, 3),
            (130, 13, 7, 1),
            (9, 70, 11, 2),
            (40, 8, 45, 2),
            (41, 24, 77, 1),
            (256, 8, 1536, 700),
        ] {
            let w = weights(n_in, rank, n_out, (n_in * 31 + rank) as u64);
            let x: Vec<f32> = (0..tokens * n_in)
                .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
                .collect();
            let want = exact(&x, &w);
            for level in CpuLevel::ALL {
                if level.clamp_to_hardware() != level {
                    continue;
                }
                let mut y = vec![0.5f32; tokens * n_out];
                if tokens * (n_in + n_out) * rank >= MIN_PARALLEL_MACS {
                    add_delta(&x, &mut y, &w.view());
                } else {
                    for (xt, yt) in x.chunks_exact(n_in).zip(y.chunks_exact_mut(n_out)) {
                        token(level, xt, yt, &w.view());
                    }
                }
                for (i, (&got, &d)) in y.iter().zip(&want).enumerate() {
                    let tol = 1e-5 * (1.0 + d.abs()) * (n_in as f64).sqrt();
                    assert!(
                        (got as f64 - 0.5 - d).abs() < tol,
                        "{n_in}x{rank}x{n_out} {level:?} at {i}: {got} vs {}",
                        d + 0.5
                    );
                }
            }
        }
    }

    #[test]
    fn modules_of_one_input_in_one_dispatch_equal_each_alone() {
        let mods = [(576, 8, 576), (576, 8, 192), (576, 12, 192)];
        let ws: Vec<LoraWeights> = mods
            .iter()
            .enumerate()
            .map(|(i, &(n_in, r, n_out))| weights(n_in, r, n_out, i as u64 + 3))
            .collect();
        for tokens in [1, 3] {
            let x: Vec<f32> = (0..tokens * 576)
                .map(|i| (i % 17) as f32 / 8.0 - 1.0)
                .collect();
            let mut alone: Vec<Vec<f32>> = ws
                .iter()
                .map(|w| vec![0.25f32; tokens * w.out_features])
                .collect();
            for (y, w) in alone.iter_mut().zip(&ws) {
                add_delta(&x, y, &w.view());
            }
            let mut together: Vec<Vec<f32>> = ws
                .iter()
                .map(|w| vec![0.25f32; tokens * w.out_features])
                .collect();
            let jobs: Vec<_> = together
                .iter_mut()
                .zip(&ws)
                .map(|(y, w)| {
                    (
                        std::sync::Mutex::new(y.as_mut_slice()),
                        w.view(),
                        x.as_slice(),
                    )
                })
                .collect();
            add_deltas(&jobs);
            drop(jobs);
            assert_eq!(alone, together, "{tokens} tokens");
        }
    }

    #[test]
    fn a_token_gets_the_same_bits_alone_and_in_a_pooled_chunk() {
        // In a chunk past the threshold the tokens are spread over the pool; alone, a token
        // runs on the calling thread.
        for (n_in, rank, n_out) in [(512, 8, 512), (1536, 12, 576), (576, 8, 1536), (100, 8, 40)] {
            let w = weights(n_in, rank, n_out, 5);
            let tokens = (MIN_PARALLEL_MACS / ((n_in + n_out) * rank) + 1).max(200);
            let x: Vec<f32> = (0..tokens * n_in)
                .map(|i| ((i * 104_729 % 2000) as f32 / 1000.0) - 1.0)
                .collect();
            assert!(tokens * (n_in + n_out) * rank >= MIN_PARALLEL_MACS);
            let mut all = vec![0f32; tokens * n_out];
            add_delta(&x, &mut all, &w.view());
            for t in [0, 123] {
                let mut one = vec![0f32; n_out];
                add_delta(&x[t * n_in..(t + 1) * n_in], &mut one, &w.view());
                assert_eq!(
                    one,
                    all[t * n_out..(t + 1) * n_out],
                    "{n_in}x{rank}x{n_out} token {t}"
                );
            }
        }
    }
}

#[cfg(test)]
mod speed {
    use super::*;
    use crate::lora::LoraWeights;

    #[test]
    #[ignore = "timing: cargo test -p kiln-model --lib lora_speed -- --ignored --nocapture"]
    fn lora_speed() {
        for (n_in, rank, n_out) in [(576, 8, 1536), (1536, 8, 576), (576, 12, 192)] {
            let w = LoraWeights {
                in_features: n_in,
                out_features: n_out,
                rank,
                a: vec![0.01; n_in * rank],
                b: vec![0.02; rank * n_out],
                scale: 1.0,
            };
            let x = vec![0.5f32; n_in];
            let mut y = vec![0f32; n_out];
            for level in CpuLevel::ALL {
                if level.clamp_to_hardware() != level {
                    continue;
                }
                let reps = 20_000;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    token(level, &x, &mut y, &w.view());
                }
                let s = t.elapsed().as_secs_f64();
                let macs = (reps * (n_in + n_out) * rank) as f64;
                eprintln!(
                    "{n_in}x{rank}x{n_out} {level:?}: {:.2} GMAC/s ({:.2} us per token)",
                    macs / s / 1e9,
                    s / reps as f64 * 1e6
                );
            }
            std::hint::black_box(&y);
        }
    }
}
