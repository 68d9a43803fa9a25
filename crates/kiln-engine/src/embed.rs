//! Embeddings on the engine: many inputs in one forward, each in its own KV slot from position
//! 0, pooled as the model says (`kiln_model::embedding`). Normalizing and truncating to fewer
//! dimensions are the caller's ([`l2_normalize`]).

use kiln_model::backend::{Backend, BatchLayout, KvStore, SeqSpan};

use crate::{Engine, EngineError};

impl<B: Backend> Engine<B> {
    /// Whether the model is an embedding model (it then embeds and does not generate).
    pub fn is_embedding_model(&self) -> bool {
        self.model.embedding.is_some()
    }

    /// The pooled state of each of `inputs` (token ids), unnormalized, in order. Inputs run
    /// together, at most one per KV slot and `batch_tokens` tokens per forward (an input
    /// longer than that runs alone); each must fit the context.
    pub fn embed(&mut self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.embed_typed(inputs, None)
    }

    /// [`Engine::embed`] with each input's token types (an encoder's pair inputs: a reranker's
    /// query and document); a reranker gives one score per input.
    pub fn embed_typed(
        &mut self,
        inputs: &[Vec<u32>],
        types: Option<&[Vec<u32>]>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let Some(cfg) = self.model.embedding else {
            return Err(EngineError::Request(
                "this model is not an embedding model (it declares no pooling)".into(),
            ));
        };
        if self.has_work() {
            return Err(EngineError::Request(
                "the engine is generating; embeddings run on an idle engine".into(),
            ));
        }
        let ctx = self.options.context_len;
        if let Some((i, t)) = inputs
            .iter()
            .enumerate()
            .find(|(_, t)| t.is_empty() || t.len() > ctx)
        {
            return Err(EngineError::Request(format!(
                "input {i} has {} tokens; an input takes 1 to {ctx} (the context)",
                t.len()
            )));
        }
        if let Some(t) = types
            && (t.len() != inputs.len() || t.iter().zip(inputs).any(|(a, b)| a.len() != b.len()))
        {
            return Err(EngineError::Request(
                "every input needs one token type per token".into(),
            ));
        }
        let slots = self.kv.layout().n_slots.max(1);
        let budget = self.options.batch_tokens;
        let width = match cfg.pooling {
            kiln_model::embedding::Pooling::Rank => 1,
            _ => self.model.config.hidden_size,
        };
        let mut out = Vec::with_capacity(inputs.len());
        let mut next = 0;
        while next < inputs.len() {
            let mut spans = Vec::new();
            let mut tokens = Vec::new();
            let mut token_types = Vec::new();
            while next < inputs.len()
                && spans.len() < slots
                && (spans.is_empty() || tokens.len() + inputs[next].len() <= budget)
            {
                spans.push(SeqSpan {
                    slot: spans.len(),
                    start_pos: 0,
                    n_tokens: inputs[next].len(),
                });
                tokens.extend_from_slice(&inputs[next]);
                if let Some(t) = types {
                    token_types.extend_from_slice(&t[next]);
                }
                next += 1;
            }
            let layout = BatchLayout { spans };
            let typed = types.map(|_| token_types.as_slice());
            let pooled = self.model.model.pooled(
                &self.backend,
                &mut self.kv,
                &tokens,
                typed,
                &layout,
                cfg.pooling,
            )?;
            for s in &layout.spans {
                self.kv.set_seq_len(s.slot, 0);
            }
            out.extend(pooled.chunks_exact(width).map(<[f32]>::to_vec));
        }
        Ok(out)
    }
}

/// Scales `v` to unit L2 norm (a zero vector stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        v.iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
}
