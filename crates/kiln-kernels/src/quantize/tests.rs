//! Every level's quantizers against ggml's reference loop, edge cases included.

/// ggml's reference loop, for the edge cases below.
fn reference_q8_0(x: &[f32]) -> (half::f16, [i8; 32]) {
    let amax = x
        .iter()
        .fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() });
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (
        half::f16::from_f32(d),
        std::array::from_fn(|i| (x[i] * id).round() as i8),
    )
}

#[test]
fn quantize_q8_0_matches_the_reference_loop_on_edge_blocks() {
    let mut blocks: Vec<[f32; 32]> = vec![[0.0; 32], [1e-40; 32], [f32::MAX; 32]];
    let mut b = [0.0f32; 32];
    for (i, v) in b.iter_mut().enumerate() {
        *v = (i as f32 - 15.5) * 0.37;
    }
    blocks.push(b);
    for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-39, -3e38] {
        for pos in [0, 7, 31] {
            let mut c = b;
            c[pos] = special;
            blocks.push(c);
        }
    }
    for blk in &blocks {
        let mut y = [crate::BlockQ8_0::default()];
        super::quantize_row_q8_0(blk, &mut y).unwrap();
        let (d, qs) = reference_q8_0(blk);
        assert_eq!(y[0].d.to_bits(), d.to_bits(), "{blk:?}");
        assert_eq!(y[0].qs, qs, "{blk:?}");
    }
}

#[test]
fn every_level_quantizes_like_the_reference() {
    let mut blocks: Vec<f32> = Vec::new();
    let mut state = 0x1234_5678_9abc_def0u64;
    for i in 0..4000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        // Scales from tiny to huge, plus exact halves after scaling.
        let scale = [1e-3, 1.0, 37.0, 1e6, 1e-30][i % 5];
        blocks.push(if i % 97 == 0 { 127.0 * 0.5 } else { u * scale });
    }
    let specials = [
        f32::NAN,
        f32::INFINITY,
        -f32::INFINITY,
        1e-40,
        -0.0,
        f32::MAX,
    ];
    for (k, &sp) in specials.iter().enumerate() {
        blocks[32 * (k + 3) + 5 * k] = sp;
    }
    blocks.extend([1e-40f32; 32]);
    let nb = blocks.len() / 32;
    let mut want0 = vec![crate::BlockQ8_0::default(); nb];
    let mut want1 = vec![crate::BlockQ8_1::default(); nb];
    super::quantize_row_q8_0(&blocks, &mut want0).unwrap();
    super::quantize_row_q8_1(&blocks, &mut want1).unwrap();
    for level in crate::supported_levels() {
        let mut got0 = vec![crate::BlockQ8_0::default(); nb];
        let mut got1 = vec![crate::BlockQ8_1::default(); nb];
        super::quantize_q8_0_at(level, &blocks, &mut got0).unwrap();
        super::quantize_q8_1_at(level, &blocks, &mut got1).unwrap();
        for b in 0..nb {
            assert_eq!(
                got0[b].to_bytes(),
                want0[b].to_bytes(),
                "Q8_0 {level:?} block {b}"
            );
            assert_eq!(
                got1[b].to_bytes(),
                want1[b].to_bytes(),
                "Q8_1 {level:?} block {b}"
            );
        }
    }
}

#[test]
fn every_level_quantizes_q8_k_like_the_reference() {
    let mut x: Vec<f32> = Vec::new();
    let mut state = 0x0fed_cba9_8765_4321u64;
    for i in 0..256 * 24 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let scale = [1e-3, 1.0, 37.0, 1e6, 1e-30, 3.0][(i / 256) % 6];
        x.push(u * scale);
    }
    // Ties for the largest magnitude (the first one sets the sign), exact halves, and the
    // values that send a block to the scalar path.
    x[256 + 10] = 40.0;
    x[256 + 20] = -40.0;
    x[2 * 256 + 7] = -40.0;
    x[2 * 256 + 9] = 40.0;
    x[4 * 256 + 17] = 50.0;
    x[4 * 256 + 22] = -50.0;
    // Largest magnitude 127 makes `iscale` −1: every half below is a tie to round to even.
    for (j, v) in x[3 * 256..4 * 256].iter_mut().enumerate() {
        *v = (j % 11) as f32 * 0.5 - 2.5;
    }
    x[3 * 256 + 3] = 127.0;
    let specials = [
        f32::NAN,
        f32::INFINITY,
        -f32::INFINITY,
        1e-40,
        f32::MAX,
        -f32::MAX,
    ];
    for (k, &sp) in specials.iter().enumerate() {
        x[256 * (k + 5) + 11 * k] = sp;
    }
    x[256 * 12..256 * 13].fill(0.0);
    x[256 * 13..256 * 14].fill(1e-40);
    x[256 * 14..256 * 15].fill(-0.0);
    let nb = x.len() / 256;
    let bytes = |b: &crate::BlockQ8K| {
        let mut v = b.d.to_bits().to_le_bytes().to_vec();
        v.extend(b.qs.iter().map(|&q| q as u8));
        v.extend(b.bsums.iter().flat_map(|s| s.to_le_bytes()));
        v
    };
    let mut want = vec![crate::BlockQ8K::default(); nb];
    super::quantize_row_q8_k(&x, &mut want).unwrap();
    for level in crate::supported_levels() {
        let mut got = vec![crate::BlockQ8K::default(); nb];
        super::quantize_q8_k_at(level, &x, &mut got).unwrap();
        for b in 0..nb {
            assert_eq!(bytes(&got[b]), bytes(&want[b]), "Q8_K {level:?} block {b}");
        }
    }
}
