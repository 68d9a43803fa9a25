use super::*;

/// Builds a minimal GGUF v3 file in memory, for tests and fuzz seeds.
pub(crate) struct GgufBuilder {
    kv: Vec<u8>,
    kv_count: u64,
    infos: Vec<u8>,
    tensor_count: u64,
    data: Vec<u8>,
}

impl GgufBuilder {
    pub(crate) fn new() -> Self {
        Self {
            kv: vec![],
            kv_count: 0,
            infos: vec![],
            tensor_count: 0,
            data: vec![],
        }
    }

    fn put_str(buf: &mut Vec<u8>, s: &str) {
        buf.extend((s.len() as u64).to_le_bytes());
        buf.extend(s.as_bytes());
    }

    pub(crate) fn kv_u32(mut self, key: &str, v: u32) -> Self {
        Self::put_str(&mut self.kv, key);
        self.kv.extend(4u32.to_le_bytes());
        self.kv.extend(v.to_le_bytes());
        self.kv_count += 1;
        self
    }

    pub(crate) fn kv_str(mut self, key: &str, v: &str) -> Self {
        Self::put_str(&mut self.kv, key);
        self.kv.extend(8u32.to_le_bytes());
        Self::put_str(&mut self.kv, v);
        self.kv_count += 1;
        self
    }

    pub(crate) fn kv_str_array(mut self, key: &str, vs: &[&str]) -> Self {
        Self::put_str(&mut self.kv, key);
        self.kv.extend(9u32.to_le_bytes());
        self.kv.extend(8u32.to_le_bytes());
        self.kv.extend((vs.len() as u64).to_le_bytes());
        for v in vs {
            Self::put_str(&mut self.kv, v);
        }
        self.kv_count += 1;
        self
    }

    pub(crate) fn f32_tensor(mut self, name: &str, dims: &[u64], values: &[f32]) -> Self {
        while !self.data.len().is_multiple_of(32) {
            self.data.push(0);
        }
        Self::put_str(&mut self.infos, name);
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(0u32.to_le_bytes());
        self.infos.extend((self.data.len() as u64).to_le_bytes());
        for v in values {
            self.data.extend(v.to_le_bytes());
        }
        self.tensor_count += 1;
        self
    }

    pub(crate) fn build(self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.tensor_count.to_le_bytes());
        out.extend(self.kv_count.to_le_bytes());
        out.extend(self.kv);
        out.extend(self.infos);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        out.extend(self.data);
        out
    }
}

fn sample() -> Vec<u8> {
    GgufBuilder::new()
        .kv_str("general.architecture", "llama")
        .kv_u32("llama.block_count", 2)
        .kv_str_array("tokenizer.ggml.tokens", &["a", "b", "c"])
        .f32_tensor("w", &[4, 2], &[1., 2., 3., 4., 5., 6., 7., 8.])
        .f32_tensor("b", &[3], &[9., 10., 11.])
        .build()
}

fn parse(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
    GgufHeader::parse(bytes, bytes.len() as u64)
}

#[test]
fn parses_a_well_formed_file() {
    let bytes = sample();
    let h = parse(&bytes).expect("valid file");
    assert_eq!(h.version, 3);
    assert_eq!(
        h.get("general.architecture").and_then(|v| v.as_str()),
        Some("llama")
    );
    assert_eq!(h.get("llama.block_count").and_then(|v| v.as_u64()), Some(2));
    let toks = h
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .expect("array");
    assert_eq!(toks.len(), 3);
    let w = h.tensor("w").expect("tensor w");
    assert_eq!(w.dims, vec![4, 2]);
    assert_eq!(w.size_bytes, 32);
    let start = (h.data_offset + w.offset) as usize;
    assert_eq!(&bytes[start..start + 4], &1f32.to_le_bytes());
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = sample();
    for len in 0..bytes.len() {
        assert!(
            parse(&bytes[..len]).is_err(),
            "prefix of {len} bytes parsed"
        );
    }
}

#[test]
fn wrong_magic_is_named() {
    let mut bytes = sample();
    bytes[0] = b'X';
    let err = parse(&bytes).expect_err("bad magic").to_string();
    assert!(err.contains("magic"), "{err}");
}

#[test]
fn unsupported_version_is_refused() {
    let mut bytes = sample();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    let err = parse(&bytes).expect_err("v1").to_string();
    assert!(err.contains("version"), "{err}");
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let mut bytes = sample();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(
        parse(&bytes)
            .expect_err("tensor count")
            .to_string()
            .contains("tensor_count")
    );
    let mut bytes = sample();
    bytes[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(
        parse(&bytes)
            .expect_err("kv count")
            .to_string()
            .contains("kv_count")
    );
}

#[test]
fn offset_past_the_end_names_the_tensor() {
    let bytes = GgufBuilder::new().f32_tensor("w", &[8], &[0.0; 8]).build();
    // Drop the last 4 bytes of data: the tensor now runs past the end.
    let err = parse(&bytes[..bytes.len() - 4])
        .expect_err("short data")
        .to_string();
    assert!(err.contains("w: offset"), "{err}");
}

#[test]
fn absurd_dims_and_unknown_types_are_refused() {
    let good = GgufBuilder::new().f32_tensor("w", &[8], &[0.0; 8]).build();
    // Layout after the 24-byte preamble: name (8 + 1), n_dims (4), dim (8), type (4), offset (8).
    let dim_at = 24 + 9 + 4;
    let mut bytes = good.clone();
    bytes[dim_at..dim_at + 8].copy_from_slice(&(1u64 << 50).to_le_bytes());
    assert!(
        parse(&bytes)
            .expect_err("dims")
            .to_string()
            .contains("w: dims")
    );
    let mut bytes = good.clone();
    bytes[dim_at..dim_at + 8].copy_from_slice(&0u64.to_le_bytes());
    assert!(parse(&bytes).is_err());
    let mut bytes = good.clone();
    bytes[dim_at + 8..dim_at + 12].copy_from_slice(&77u32.to_le_bytes());
    assert!(
        parse(&bytes)
            .expect_err("type")
            .to_string()
            .contains("w: type")
    );
    let mut bytes = good;
    bytes[24 + 9..24 + 13].copy_from_slice(&9u32.to_le_bytes());
    assert!(
        parse(&bytes)
            .expect_err("n_dims")
            .to_string()
            .contains("n_dims")
    );
}

#[test]
fn unknown_metadata_type_is_refused() {
    let mut bytes = GgufBuilder::new().kv_u32("k", 1).build();
    // key "k": 8 + 1 bytes after the preamble, then the type.
    bytes[24 + 9..24 + 13].copy_from_slice(&99u32.to_le_bytes());
    assert!(
        parse(&bytes)
            .expect_err("type")
            .to_string()
            .contains("unknown metadata value type")
    );
}

#[test]
fn random_mutations_never_panic() {
    let base = sample();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..5000 {
        let mut bytes = base.clone();
        for _ in 0..4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let at = (state % bytes.len() as u64) as usize;
            bytes[at] = (state >> 32) as u8;
        }
        let _ = parse(&bytes);
    }
}

#[test]
fn writer_output_reads_back_with_every_value_type_and_aligned_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.gguf");
    let metadata: Vec<(String, MetaValue)> = vec![
        (
            "general.architecture".into(),
            MetaValue::String("llama".into()),
        ),
        ("a.u8".into(), MetaValue::U8(7)),
        ("a.i8".into(), MetaValue::I8(-7)),
        ("a.u16".into(), MetaValue::U16(700)),
        ("a.i16".into(), MetaValue::I16(-700)),
        ("a.u32".into(), MetaValue::U32(70_000)),
        ("a.i32".into(), MetaValue::I32(-70_000)),
        ("a.u64".into(), MetaValue::U64(1 << 40)),
        ("a.i64".into(), MetaValue::I64(-(1 << 40))),
        ("a.f32".into(), MetaValue::F32(0.5)),
        ("a.f64".into(), MetaValue::F64(-0.25)),
        ("a.bool".into(), MetaValue::Bool(true)),
        (
            "a.strings".into(),
            MetaValue::Array(vec![
                MetaValue::String("x".into()),
                MetaValue::String("yz".into()),
            ]),
        ),
        ("a.empty".into(), MetaValue::Array(vec![])),
    ];
    let q8 = GgmlType::Q8_0;
    let specs = vec![
        GgufTensorSpec {
            name: "t.f32".into(),
            dims: vec![3, 2],
            ty: GgmlType::F32,
        },
        GgufTensorSpec {
            name: "t.q8".into(),
            dims: vec![64, 1],
            ty: q8,
        },
    ];
    let f32_bytes: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let q8_bytes: Vec<u8> = (0..q8.row_bytes(64).unwrap()).map(|i| i as u8).collect();
    let mut w = GgufWriter::create(&path, &metadata, specs).unwrap();
    assert!(w.write_tensor("t.q8", &q8_bytes).is_err(), "out of order");
    w.write_tensor("t.f32", &f32_bytes).unwrap();
    assert!(
        w.write_tensor("t.q8", &q8_bytes[1..]).is_err(),
        "short data"
    );
    w.write_tensor("t.q8", &q8_bytes).unwrap();
    w.finish().unwrap();

    let file = GgufFile::open(&path).unwrap();
    let h = file.header();
    for (k, v) in &metadata {
        assert_eq!(h.get(k), Some(v), "{k}");
    }
    let t = h.tensor("t.f32").unwrap();
    assert_eq!((t.dims.clone(), t.ty), (vec![3, 2], GgmlType::F32));
    assert_eq!(file.tensor_data(t), &f32_bytes[..]);
    assert_eq!(file.tensor_data(h.tensor("t.q8").unwrap()), &q8_bytes[..]);
}

#[test]
fn writer_refuses_to_finish_with_a_tensor_missing() {
    let dir = tempfile::tempdir().unwrap();
    let spec = GgufTensorSpec {
        name: "t".into(),
        dims: vec![4],
        ty: GgmlType::F32,
    };
    let w = GgufWriter::create(&dir.path().join("m.gguf"), &[], vec![spec]).unwrap();
    let err = w.finish().unwrap_err().to_string();
    assert!(err.contains("never written"), "{err}");
}
