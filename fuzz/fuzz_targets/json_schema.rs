//! Arbitrary bytes as a structured-output grammar, after a selector byte: bit 0 picks the
//! tokenizer (the `gguf_header` seeds' tiny byte-level BPE or SentencePiece vocabulary), bit 1
//! whether the rest is a JSON schema or a Lark grammar, bit 2 whether a JSON schema is made
//! strict first (`close_objects`). Compiling must give a grammar or an error, never panic; a
//! grammar that compiles is then followed for up to 32 steps, each choosing the allowed token
//! the input's bytes point at, and every step must mask, accept or fail cleanly.

#![no_main]

use std::sync::OnceLock;

use kiln_engine::structured::{GrammarCompiler, GrammarSpec};
use kiln_model::gguf::GgufHeader;
use kiln_model::tokenizer::tokenizer_from_gguf;
use libfuzzer_sys::fuzz_target;

const GGUFS: [&[u8]; 2] = [
    include_bytes!("../seeds/gguf_header/tiny_llama_gpt2.bin"),
    include_bytes!("../seeds/gguf_header/tiny_llama_spm.bin"),
];

fn compilers() -> &'static [(GrammarCompiler, usize)] {
    static C: OnceLock<Vec<(GrammarCompiler, usize)>> = OnceLock::new();
    C.get_or_init(|| {
        GGUFS
            .iter()
            .map(|bytes| {
                let header = GgufHeader::parse(bytes, bytes.len() as u64).expect("seed GGUF");
                let tokenizer = tokenizer_from_gguf(&header).expect("seed tokenizer");
                let n = tokenizer.vocab_size();
                (GrammarCompiler::new(&tokenizer, n).expect("compiler"), n)
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let (compiler, vocab) = &compilers()[usize::from(sel & 1)];
    let spec = if sel & 2 == 0 {
        let Ok(mut schema) = serde_json::from_str::<serde_json::Value>(text) else {
            return;
        };
        if sel & 4 != 0 {
            kiln_server::structured::close_objects(&mut schema);
        }
        GrammarSpec::JsonSchema(schema)
    } else {
        GrammarSpec::Lark(text.to_string())
    };
    let Ok(grammar) = compiler.compile(&spec) else {
        return;
    };
    let mut c = grammar.start();
    let mut logits = vec![0.0f32; *vocab];
    for (step, &b) in rest.iter().cycle().take(32).enumerate() {
        if c.finished() {
            break;
        }
        logits.iter_mut().for_each(|l| *l = 0.0);
        if c.mask(&mut logits).is_err() {
            break;
        }
        let allowed: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize].is_finite())
            .collect();
        let Some(&tok) = allowed.get((usize::from(b) + step) % allowed.len().max(1)) else {
            break;
        };
        if c.accept(tok).is_err() {
            break;
        }
    }
});
