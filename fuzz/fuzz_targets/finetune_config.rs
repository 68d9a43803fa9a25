//! Arbitrary bytes as a `finetune` job config: it must parse or give a config error naming a
//! field, never panic; what parses must pass its own range checks and round-trip through serde.

#![no_main]

use kiln_lab::LabError;
use kiln_lab::finetune::config::FinetuneConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    match FinetuneConfig::from_json(&map) {
        Ok(cfg) => {
            assert!(cfg.validate().is_ok());
            let again = serde_json::to_value(&cfg).expect("a parsed config serializes");
            let back = FinetuneConfig::from_json(again.as_object().expect("an object")).expect("round trip");
            assert_eq!(back, cfg);
            let _ = (cfg.peak_lr(), cfg.schedule());
        }
        Err(LabError::Config { field, .. }) => assert!(!field.is_empty()),
        Err(other) => panic!("a config parse failed with a non-config error: {other}"),
    }
});
