//! Prefill-shaped matmul rates: a batch of tokens against repacked Q4_K, Q6_K and Q8_0 matrices of
//! real model shapes (the FFN of Llama-3.2-1B, 3B and Llama-3.1-8B), in multiply-adds per
//! second at two threads. The rate per multiply-add should not fall as the matrices grow; where
//! it does, the weights or the activations no longer stay in the caches the tile loop expects.
//! Run: `cargo bench -p kiln-kernels --bench prefill_matmul` (`-- --tokens N`, default 512;
//! `KILN_CPU_LEVEL` picks the kernels).

use std::time::Instant;

use kiln_kernels::repack::{RepackedMatrix, matmul_repacked};
use kiln_kernels::{GgmlType, QMatrix, QuantizedActivations};

/// A matrix with xorshift codes and small fixed block scales.
fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> RepackedMatrix {
    // (block bytes, values per block, where the f16 scales are)
    let (block, values, scales_at) = match ty {
        GgmlType::Q4_K => (144, 256, [0usize, 2]),
        GgmlType::Q6_K => (210, 256, [208, 208]),
        _ => (34, 32, [0, 0]),
    };
    let blocks = rows * cols / values;
    let mut bytes = vec![0u8; blocks * block];
    let mut x = seed | 1;
    for b in bytes.chunks_exact_mut(block) {
        for v in b.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *v = x as u8;
        }
        for at in scales_at {
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(0.001).to_bits().to_le_bytes());
        }
    }
    let w = QMatrix::new(ty, rows, cols, &bytes).expect("matrix shape");
    RepackedMatrix::new(&w).expect("the type repacks")
}

/// Best GMAC/s of three passes of `tokens` tokens through `w`.
fn rate(w: &RepackedMatrix, tokens: usize) -> f64 {
    let x: Vec<f32> = (0..tokens * w.cols())
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    let mut scratch = QuantizedActivations::new();
    let mut out = vec![0f32; tokens * w.rows()];
    let macs = (tokens * w.rows() * w.cols()) as f64;
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        matmul_repacked(w, &x, tokens, &mut out, &mut scratch).expect("matmul");
        best = best.max(macs / t.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(&out);
    best
}

fn main() {
    // `cargo test --benches` runs this too, unoptimised and without `--bench`: skip there.
    if !std::env::args().any(|a| a == "--bench") {
        println!("prefill_matmul: a benchmark; run it with `cargo bench`");
        return;
    }
    let tokens = match tokens() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("prefill_matmul: {e}");
            std::process::exit(2);
        }
    };
    if !RepackedMatrix::worthwhile(kiln_kernels::cpu_level(), GgmlType::Q4_K) {
        println!("prefill_matmul: no repacked Q4_K kernel on this CPU; nothing to measure");
        return;
    }
    kiln_kernels::pool::set_threads(2);
    println!(
        "level {}, {tokens} tokens, 2 threads",
        kiln_kernels::cpu_level().name()
    );
    println!("| shape | rows × cols | type | MB | GMAC/s |");
    println!("| --- | ---: | --- | ---: | ---: |");
    let shapes = [
        ("1B gate", 8192, 2048),
        ("1B down", 2048, 8192),
        ("3B gate", 8192, 3072),
        ("3B down", 3072, 8192),
        ("8B gate", 14336, 4096),
        ("8B down", 4096, 14336),
    ];
    for (name, rows, cols) in shapes {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
            let w = matrix(ty, rows, cols, rows as u32);
            let mb = w.size_bytes() as f64 / 1e6;
            println!(
                "| {name} | {rows} × {cols} | {ty:?} | {mb:.0} | {:.1} |",
                rate(&w, tokens)
            );
        }
    }
}

/// `--tokens N` (1 to 4096), else 512.
fn tokens() -> Result<usize, String> {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|a| a == "--tokens") else {
        return Ok(512);
    };
    let value = args.get(at + 1).ok_or("--tokens needs a value")?;
    match value.parse() {
        Ok(n) if (1..=4096).contains(&n) => Ok(n),
        _ => Err(format!("--tokens {value:?}: a number from 1 to 4096")),
    }
}
