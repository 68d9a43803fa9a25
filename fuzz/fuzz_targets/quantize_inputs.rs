//! The quantize job's own parsers on arbitrary bytes, chosen by the first byte: the job config
//! (`QuantizeConfig::parse_json`), JSONL calibration records (`calibration::parse_jsonl`) and an
//! earlier run's sensitivity report (`run::parse_sensitivity`). Each must answer or give an
//! error, never panic.

#![no_main]

use std::path::PathBuf;

use kiln_lab::quantize::{QuantizeConfig, calibration, run};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 3 {
        0 => {
            if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(text) {
                let resolve = |s: &str| Some(PathBuf::from(s));
                let parsed = QuantizeConfig::parse_json(&map, &resolve, |_, _, suffix| {
                    PathBuf::from(suffix)
                });
                if let Ok(cfg) = parsed {
                    let _ = (cfg.candidates(), cfg.name_suffix(), cfg.uniform_gguf_type());
                }
            }
        }
        1 => {
            let _ = calibration::parse_jsonl(text);
        }
        _ => {
            let _ = run::parse_sensitivity(text);
        }
    }
});
