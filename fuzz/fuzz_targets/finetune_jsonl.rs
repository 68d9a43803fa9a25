//! Arbitrary bytes as a fine-tune JSONL file, after a selector byte: bit 0 picks the tokenizer
//! (the `gguf_header` seeds' tiny byte-level BPE or SentencePiece vocabulary), bit 1 a ChatML
//! template or none, the other six bits `max_seq_length - 1` (1..=64; 1 is refused as a config
//! error). `load_jsonl` and `inspect_data_dir` must answer or give an error, never panic, and
//! agree: whatever loads also inspects, with the same format and row count, and every kept
//! example fits `max_seq_length` with a loss token left. The epoch order is then computed over
//! the examples' lengths and must stay within them.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use kiln_lab::finetune::data::{Examples, Tokenize, epoch_batches, inspect_data_dir, load_jsonl};
use kiln_model::chat_template::ChatTemplate;
use kiln_model::gguf::GgufHeader;
use kiln_model::tokenizer::{KilnTokenizer, tokenizer_from_gguf};
use libfuzzer_sys::fuzz_target;

/// Small vocabularies that build in microseconds; `hostile_files::fuzz_seeds_are_current`
/// keeps these files current.
const GGUFS: [&[u8]; 2] = [
    include_bytes!("../seeds/gguf_header/tiny_llama_gpt2.bin"),
    include_bytes!("../seeds/gguf_header/tiny_llama_spm.bin"),
];

/// SmolLM2's ChatML template.
const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

struct Model {
    tokenizer: KilnTokenizer,
    template: ChatTemplate,
}

/// The two tokenizers with the template, built once per process.
fn models() -> &'static [Model] {
    static MODELS: OnceLock<Vec<Model>> = OnceLock::new();
    MODELS.get_or_init(|| {
        GGUFS
            .iter()
            .map(|bytes| {
                let header = GgufHeader::parse(bytes, bytes.len() as u64).expect("seed GGUF");
                let tokenizer = tokenizer_from_gguf(&header).expect("seed tokenizer");
                let (bos, eos) = (tokenizer.bos_token(), tokenizer.eos_token());
                let template = ChatTemplate::new(CHATML, bos.as_deref(), eos.as_deref())
                    .expect("ChatML template");
                Model {
                    tokenizer,
                    template,
                }
            })
            .collect()
    })
}

/// This process's scratch file in the temp folder, left behind at exit (parallel fuzz jobs are
/// separate processes, so each has its own).
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("kiln-fuzz-finetune-{}.jsonl", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, file)) = data.split_first() else {
        return;
    };
    let Some(model) = models().get(usize::from(selector & 1)) else {
        return;
    };
    let max_seq_length = usize::from(selector >> 2) + 1;
    let tk = Tokenize {
        tokenizer: &model.tokenizer,
        template: (selector & 2 != 0).then_some(&model.template),
        max_seq_length,
    };
    let path = scratch();
    if std::fs::write(path, file).is_err() {
        return;
    }
    let loaded = load_jsonl(path, &tk);
    let inspected = inspect_data_dir(path);
    let Ok(ds) = loaded else {
        return;
    };
    let summary = inspected.expect("a file that loads must inspect");
    assert_eq!(summary.format, ds.format);
    assert_eq!(summary.n_train, ds.examples.len() + ds.dropped);
    let sequences: Vec<_> = match &ds.examples {
        Examples::Sft(v) => v.iter().collect(),
        Examples::Preference(v) => v.iter().flat_map(|p| [&p.chosen, &p.rejected]).collect(),
    };
    for ex in sequences {
        assert!(ex.tokens.len() <= max_seq_length && ex.n_targets() > 0);
    }
    let lengths = ds.examples.lengths();
    for batch_size in [1, 2, 3] {
        let batches = epoch_batches(&lengths, batch_size, u64::from(selector), 1);
        assert!(batches.iter().flatten().all(|&i| i < lengths.len()));
    }
});
