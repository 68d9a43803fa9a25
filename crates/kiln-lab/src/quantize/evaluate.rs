//! The result's quality, as `kiln eval kl` measures it: KL of the written model's next-token
//! distributions against the source's (dequantized, f32 cache) and their top-1 agreement.

use std::path::Path;

use kiln_engine::eval::{KlEvalReport, eval_kl};
use kiln_engine::kv_scheme::{DenseDtype, KvScheme};
use kiln_engine::{Engine, EngineOptions, load_model};
use kiln_model::backend::cpu::{CpuBackend, CpuOptions};

use super::calibration;
use crate::LabError;

/// Tokens of the built-in text scored, and the window they are scored in.
const EVAL_TOKENS: usize = 512;
const EVAL_WINDOW: usize = 128;

fn engine(path: &Path, dense: bool) -> Result<Engine<CpuBackend>, LabError> {
    let backend = CpuBackend::new(CpuOptions { dense });
    let model = load_model(&backend, path)?;
    let options = EngineOptions {
        context_len: EVAL_WINDOW + 1,
        kv_scheme: KvScheme::dense(DenseDtype::F32),
        ..EngineOptions::default()
    };
    Ok(Engine::new(backend, model, options)?)
}

/// Scores `output` against `source` on the first [`EVAL_TOKENS`] tokens of the built-in
/// calibration text, in windows of [`EVAL_WINDOW`].
pub fn evaluate(source: &Path, output: &Path) -> Result<KlEvalReport, LabError> {
    let mut reference = engine(source, true)?;
    let mut test = engine(output, false)?;
    let mut tokens = reference
        .model()
        .tokenizer
        .encode(calibration::BUILTIN, false)
        .map_err(kiln_engine::EngineError::from)?;
    tokens.truncate(EVAL_TOKENS);
    Ok(eval_kl(&mut reference, &mut test, &tokens, EVAL_WINDOW)?)
}
