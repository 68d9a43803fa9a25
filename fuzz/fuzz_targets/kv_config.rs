//! Arbitrary bytes as a `kv_config.json`: the parser must return entries or an error naming the
//! entry, never panic, whatever the text and the model's layer count.

#![no_main]

use kiln_engine::kv_scheme::parse_kv_config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&layers, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let _ = parse_kv_config("kv_config.json", text, usize::from(layers));
});
