//! An embeddings request's `input` and a sentence-transformers Pooling config on hostile JSON:
//! `Inputs::parse` gives inputs (never more than the cap, none empty) or a 400; `pooling_of`
//! gives a pooling or an error naming the field; `kiln_engine::embed::normalize` never makes a finite
//! vector non-finite.

#![no_main]

use kiln_model::embedding::pooling_of;
use kiln_server::embeddings::input::Inputs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(inputs) = Inputs::parse(Some(&v), 8) {
        match inputs {
            Inputs::Texts(t) => assert!(t.len() <= 8 && t.iter().all(|s| !s.is_empty())),
            Inputs::Tokens(t) => assert!(t.len() <= 8 && t.iter().all(|l| !l.is_empty())),
        }
    }
    let _ = pooling_of(std::path::Path::new("1_Pooling/config.json"), &v);
    let floats: Vec<f32> = data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).filter(|x| x.is_finite()).collect();
    for p in [-1, 0, 1, 2, 3] {
        let mut x = floats.clone();
        kiln_engine::embed::normalize(&mut x, p);
        assert!(x.iter().all(|v| v.is_finite()) || floats.iter().any(|v| v.abs() > 1e30), "p={p}");
    }
});
