//! Decode-shaped matmul rates (one token against a repacked Q8_0 matrix), in weight bytes per
//! second, at 1 and 2 threads: with the matrix hot in L2 (the kernel's compute-bound rate) and
//! with a model-sized set of matrices streamed from memory (what decode gets). Run:
//! `cargo bench -p kiln-kernels --bench decode_matmul`; `-- --rows N` sets the streamed
//! matrices' rows (768 by default; the set stays ~141 MB), to see what a dispatch costs: the
//! smaller each matrix, the more of the stream goes to starting and ending a parallel step.

use std::time::Instant;

use kiln_kernels::repack::{RepackedMatrix, matmul_repacked};
use kiln_kernels::{GgmlType, QMatrix, QuantizedActivations};

/// A Q8_0 matrix of SmolLM2's MLP shape with deterministic codes and scales.
fn q8_0_matrix(rows: usize, cols: usize, seed: u32) -> RepackedMatrix {
    let blocks = rows * cols / 32;
    let mut bytes = Vec::with_capacity(blocks * 34);
    let mut x = seed;
    for _ in 0..blocks {
        bytes.extend_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
        for _ in 0..32 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            bytes.push(x as u8);
        }
    }
    let w = QMatrix::new(GgmlType::Q8_0, rows, cols, &bytes).expect("matrix shape");
    RepackedMatrix::new(&w).expect("Q8_0 repacks")
}

/// Weight GB/s of `reps` passes of one token over every matrix of `ws`.
fn rate(ws: &[RepackedMatrix], reps: usize) -> f64 {
    let cols = ws[0].cols();
    let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut scratch = QuantizedActivations::new();
    let mut out = vec![0f32; ws.iter().map(|w| w.rows()).max().unwrap_or(0)];
    let bytes: usize = ws.iter().map(|w| w.size_bytes()).sum();
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps {
            for w in ws {
                matmul_repacked(w, &x, 1, &mut out[..w.rows()], &mut scratch).expect("matmul");
            }
        }
        best = best.max((bytes * reps) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(&out);
    best
}

fn main() {
    // `cargo test --benches` runs this too, unoptimised and without `--bench`: skip there.
    if !std::env::args().any(|a| a == "--bench") {
        println!("decode_matmul: a benchmark; run it with `cargo bench`");
        return;
    }
    if !kiln_kernels::repack::RepackedMatrix::worthwhile(kiln_kernels::cpu_level(), GgmlType::Q8_0)
    {
        println!("decode_matmul: no repacked Q8_0 kernel on this CPU; nothing to measure");
        return;
    }
    // 768 x 576: 0.47 MB, inside a core's L2 (1 MiB on the machine of docs/benchmarks.md),
    // measured while it is the only weight alive, so its prefetches keep it cached
    // (`kiln_kernels::stream`).
    let hot = vec![q8_0_matrix(768, 576, 1)];
    let hot_rates = [1, 2].map(|threads| {
        kiln_kernels::pool::set_threads(threads);
        rate(&hot, 2000)
    });
    drop(hot);
    // 141 MB in all (300 matrices of 768 rows), the Q8_0 test model's size and four times a
    // 32 MiB last-level cache.
    let rows = match streamed_rows() {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("decode_matmul: {e}");
            std::process::exit(2);
        }
    };
    let count = (STREAMED_ROWS / rows).max(1);
    let cold: Vec<RepackedMatrix> = (0..count)
        .map(|i| q8_0_matrix(rows, 576, i as u32 + 2))
        .collect();
    println!("streamed: {count} matrices of {rows} x 576");
    println!("| threads | L2-resident GB/s | streamed GB/s |");
    println!("| ---: | ---: | ---: |");
    for (threads, hot_rate) in [1, 2].into_iter().zip(hot_rates) {
        kiln_kernels::pool::set_threads(threads);
        println!("| {threads} | {hot_rate:.1} | {:.1} |", rate(&cold, 10));
    }
}

/// Rows of all the streamed matrices together: 300 of 768 rows × 576 columns, 141 MB of Q8_0.
const STREAMED_ROWS: usize = 300 * 768;

/// The streamed matrices' rows: `--rows N` (a multiple of 16 from 16 to 230,400), else 768.
fn streamed_rows() -> Result<usize, String> {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|a| a == "--rows") else {
        return Ok(768);
    };
    let value = args.get(at + 1).ok_or("--rows needs a value")?;
    let rows: usize = value
        .parse()
        .map_err(|_| format!("--rows {value:?} is not a number"))?;
    if rows == 0 || !rows.is_multiple_of(16) || rows > STREAMED_ROWS {
        return Err(format!(
            "--rows {rows}: a multiple of 16 from 16 to {STREAMED_ROWS}"
        ));
    }
    Ok(rows)
}
