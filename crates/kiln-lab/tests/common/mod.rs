//! Helpers shared by the lab's integration tests.

use std::path::{Path, PathBuf};

/// The shared reference data beside the repository.
pub fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference")
}

/// Copies tiny checkpoint `arch` into `dir/<arch>` with a byte-level tokenizer (ids 0..256 of
/// its 1024), which calibration needs and the reference folders do not ship.
pub fn tiny_with_tokenizer(dir: &Path, arch: &str) -> PathBuf {
    let to = dir.join(arch);
    std::fs::create_dir(&to).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(shared().join("tiny").join(arch).join(f), to.join(f)).unwrap();
    }
    let alphabet = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet();
    let mut chars: Vec<char> = alphabet.into_iter().collect();
    chars.sort_unstable();
    let vocab: tokenizers::models::bpe::Vocab = chars
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), i as u32))
        .collect();
    let bpe = tokenizers::models::bpe::BPE::builder()
        .vocab_and_merges(vocab, vec![])
        .build()
        .unwrap();
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(
        tokenizers::pre_tokenizers::byte_level::ByteLevel::default(),
    ));
    tok.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    tok.save(to.join("tokenizer.json"), false).unwrap();
    to
}

/// The starter model, when it has been downloaded.
pub fn starter() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let p = home.join(".cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    p.is_file().then_some(p)
}
