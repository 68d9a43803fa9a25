//! Arbitrary bytes as a GGUF file. Parsing must return `Ok` or `Err`, never panic or allocate
//! without bound; a header that parses is fed to everything that reads metadata at load time
//! (model config and tokenizer), which must not panic either.

#![no_main]

use std::path::Path;

use kiln_model::config::config_from_gguf;
use kiln_model::gguf::GgufHeader;
use kiln_model::tokenizer::tokenizer_from_gguf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let file_len = data.len() as u64;
    let Ok(header) = GgufHeader::parse(data, file_len) else {
        return;
    };
    // `GgufFile::tensor_data` slices the map without further checks, relying on this.
    for t in &header.tensors {
        let end = header
            .data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.size_bytes));
        assert!(
            end.is_some_and(|e| e <= file_len),
            "{} escapes the file",
            t.name
        );
    }
    let _ = config_from_gguf(Path::new("fuzz.gguf"), &header);
    if let Ok(tok) = tokenizer_from_gguf(&header) {
        // A server encodes and decodes right after loading; a vocabulary that builds must be usable.
        if let Ok(ids) = tok.encode("Hello, world! 123 <s>", true) {
            let _ = tok.decode(&ids, false);
        }
        for id in 0..tok.vocab_size().min(64) as u32 {
            let _ = tok.token_bytes(id);
        }
    }
});
