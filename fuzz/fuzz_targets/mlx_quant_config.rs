//! Arbitrary bytes as an MLX model's `config.json`: its `quantization` (or `quantization_config`)
//! block must parse or give an error naming the field, never panic; and whatever parses must
//! survive the writer's round trip (`to_json` then parsing again gives the same block).

#![no_main]

use std::path::Path;

use kiln_model::mlx::MlxQuantization;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let path = Path::new("config.json");
    let Ok(Some(q)) = MlxQuantization::from_config(path, &json) else {
        return;
    };
    let again = MlxQuantization::from_block(path, "quantization", &q.to_json());
    assert_eq!(again.ok().as_ref(), Some(&q), "to_json does not round-trip");
    for module in q.per_module.keys() {
        let _ = q.spec_for(module);
    }
});
