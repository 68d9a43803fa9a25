//! Arbitrary bytes as a safetensors file: header parsing must return `Ok` or `Err`, never panic.

#![no_main]

use kiln_model::weights::parse_safetensors_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_safetensors_header(data);
});
