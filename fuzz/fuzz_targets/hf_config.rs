//! Arbitrary bytes as a Hugging Face `config.json`: whatever JSON parses must give a config or an
//! error, never a panic or an unbounded allocation.

#![no_main]

use std::path::Path;

use kiln_model::config::config_from_hf_json;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = config_from_hf_json(Path::new("config.json"), &json);
});
