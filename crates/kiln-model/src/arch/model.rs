//! A loaded model: weights on a backend plus its config. Stateless across calls: the KV store is
//! the caller's.

use super::decoder::{self, ForwardCtx, Layer};
use super::encoder;
use super::{gemma3, llama, qwen2, qwen3};
use crate::ModelError;
use crate::backend::{Backend, BatchLayout, KvStore, MatrixRole, RopeAngles};
use crate::config::{Architecture, ModelConfig};
use crate::embedding::Pooling;
use crate::lora::AdapterStack;
use crate::weights::{TensorSource, optional};

/// The projections of every decoder layer, as module paths under `model.layers.N`.
pub const LAYER_MATRICES: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// Which positions' logits a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// The last position of each sequence in the batch (generation).
    LastOfEach,
    /// Every position (teacher forcing, evaluation).
    All,
}

/// Where a teacher-forced forward starts ([`Model::forward_from`]).
pub struct Resume<'a, B: Backend> {
    /// The first layer run (`num_layers`: only the head).
    pub from: usize,
    /// That layer's input; `None` embeds the tokens (only with `from == 0`).
    pub input: Option<&'a B::Act>,
    /// Where to push each later layer's input and the last layer's output.
    pub capture: Option<&'a mut Vec<B::Act>>,
}

impl<B: Backend> Default for Resume<'_, B> {
    fn default() -> Self {
        Resume {
            from: 0,
            input: None,
            capture: None,
        }
    }
}

/// A decoder-only transformer on backend `B`.
pub struct Model<B: Backend> {
    config: ModelConfig,
    embed: B::Matrix,
    layers: Vec<Layer<B>>,
    /// The final norm (`None` for an encoder, whose layers end normed).
    norm: Option<B::Vector>,
    lm_head: Option<B::Matrix>,
    /// A BERT encoder's own tensors (`None` for decoders).
    encoder: Option<Box<encoder::Encoder<B>>>,
    inv_freq_global: Vec<f32>,
    inv_freq_local: Vec<f32>,
}

/// The role of the matrix `name` (as [`Model::replace_matrix`] names them), to build its
/// replacement the way loading built the original.
pub fn matrix_role(name: &str) -> MatrixRole {
    match name {
        "model.embed_tokens.weight" => MatrixRole::Embedding,
        "lm_head.weight" => MatrixRole::Head,
        _ => MatrixRole::Projection,
    }
}

impl<B: Backend> Model<B> {
    /// Loads every weight the architecture needs from `src` onto `backend`.
    pub fn load(
        backend: &B,
        src: &dyn TensorSource,
        config: ModelConfig,
    ) -> Result<Self, ModelError> {
        Self::load_for(backend, src, config, true)
    }

    /// [`Model::load`]; with `needs_head` false a missing `lm_head.weight` is allowed (an
    /// embedding model saved without its head: logits then use the embedding, unused).
    pub fn load_for(
        backend: &B,
        src: &dyn TensorSource,
        config: ModelConfig,
        needs_head: bool,
    ) -> Result<Self, ModelError> {
        let spec = match config.arch {
            Architecture::Llama => &llama::SPEC,
            Architecture::Qwen2 => &qwen2::SPEC,
            Architecture::Qwen3 => &qwen3::SPEC,
            Architecture::Gemma3 => &gemma3::SPEC,
            Architecture::Bert | Architecture::NomicBert => {
                return Self::load_encoder(backend, src, config);
            }
        };
        let (v, h) = (config.vocab_size, config.hidden_size);
        let head = optional(src, "lm_head.weight", v, h)?;
        // Whether the table is also the head, which multiplies it; otherwise rows are only
        // looked up, which a backend may serve straight from the file.
        let multiplied = needs_head && (config.tie_word_embeddings || head.is_none());
        let table_role = match multiplied {
            true => MatrixRole::Embedding,
            false => MatrixRole::Lookup,
        };
        let embed =
            decoder::matrix_as(backend, src, "model.embed_tokens.weight", table_role, v, h)?;
        let lm_head = match head {
            Some(t) if !config.tie_word_embeddings => {
                Some(backend.matrix("lm_head.weight", MatrixRole::Head, t)?)
            }
            Some(_) | None if config.tie_word_embeddings || !needs_head => None,
            _ => {
                return Err(ModelError::Tensor {
                    path: src.path().into(),
                    name: "lm_head.weight".into(),
                    reason: "missing and tie_word_embeddings is false".into(),
                });
            }
        };
        let layers = (0..config.num_layers)
            .map(|i| decoder::load_layer(backend, src, &config, i, spec))
            .collect::<Result<Vec<_>, _>>()?;
        let norm = Some(decoder::vector(backend, src, "model.norm.weight", h)?);
        Ok(Self {
            inv_freq_global: config.rope_global.inv_freq(config.head_dim),
            inv_freq_local: config.rope_local.inv_freq(config.head_dim),
            config,
            embed,
            layers,
            norm,
            lm_head,
            encoder: None,
        })
    }

    /// A BERT encoder: embeddings only, no decoder layers or head.
    fn load_encoder(
        backend: &B,
        src: &dyn TensorSource,
        config: ModelConfig,
    ) -> Result<Self, ModelError> {
        let (v, h) = (config.vocab_size, config.hidden_size);
        let name = encoder::word_embeddings(src);
        let embed = decoder::matrix_as(backend, src, &name, MatrixRole::Lookup, v, h)?;
        let encoder = encoder::Encoder::load(backend, src, &config)?;
        Ok(Self {
            inv_freq_global: Vec::new(),
            inv_freq_local: Vec::new(),
            config,
            embed,
            layers: Vec::new(),
            norm: None,
            lm_head: None,
            encoder: Some(Box::new(encoder)),
        })
    }

    /// Swaps matrix `name` (the embedding, `lm_head.weight`, or `model.layers.N.<m>.weight` for
    /// `m` in [`LAYER_MATRICES`]) for `matrix` and returns the old
    /// one, so that a caller can measure the model with one weight changed and put it back.
    pub fn replace_matrix(
        &mut self,
        name: &str,
        matrix: B::Matrix,
    ) -> Result<B::Matrix, ModelError> {
        let slot = self.matrix_mut(name).ok_or_else(|| ModelError::Tensor {
            path: Default::default(),
            name: name.into(),
            reason: "not a matrix of this model".into(),
        })?;
        Ok(std::mem::replace(slot, matrix))
    }

    fn matrix_mut(&mut self, name: &str) -> Option<&mut B::Matrix> {
        match name {
            "model.embed_tokens.weight" => return Some(&mut self.embed),
            "lm_head.weight" => return self.lm_head.as_mut(),
            _ => {}
        }
        let rest = name
            .strip_prefix("model.layers.")?
            .strip_suffix(".weight")?;
        let (index, module) = rest.split_once('.')?;
        let layer = self.layers.get_mut(index.parse::<usize>().ok()?)?;
        Some(match module {
            "self_attn.q_proj" => &mut layer.attn.q,
            "self_attn.k_proj" => &mut layer.attn.k,
            "self_attn.v_proj" => &mut layer.attn.v,
            "self_attn.o_proj" => &mut layer.attn.o,
            "mlp.gate_proj" => &mut layer.mlp.gate,
            "mlp.up_proj" => &mut layer.mlp.up,
            "mlp.down_proj" => &mut layer.mlp.down,
            _ => return None,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Runs `tokens` (laid out by `batch`) through the model, appending their keys and values to
    /// `kv`, and returns row-major logits `[n, vocab]` for the positions `want` selects.
    ///
    /// A span may start before its slot's current end (the cache is cut back to `start_pos`,
    /// as a prompt-cache hit does) but not after it.
    pub fn forward(
        &self,
        b: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        batch: &BatchLayout,
        want: LogitsWanted,
    ) -> Result<Vec<f32>, ModelError> {
        self.run(b, kv, tokens, batch, want, Resume::default(), &[])
    }

    /// [`Model::forward`] with LoRA adapters: `adapters[i]` is the stack span `i` of `batch`
    /// runs with (`None` or an empty stack: the base model), so sequences with different
    /// adapters share one forward and each gets its own deltas. Each adapted projection adds
    /// `s·(x·A)·B` beside the base weight ([`Backend::lora_add`]); an empty slice is the base
    /// for every span.
    pub fn forward_with(
        &self,
        b: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        batch: &BatchLayout,
        want: LogitsWanted,
        adapters: &[Option<&AdapterStack>],
    ) -> Result<Vec<f32>, ModelError> {
        self.run(b, kv, tokens, batch, want, Resume::default(), adapters)
    }

    /// A teacher-forced forward (every position's logits) that starts at layer `resume.from`
    /// with `resume.input` as that layer's input instead of embedding `tokens` (which must
    /// still be the tokens, for the batch's shape), and pushes each later layer's input and the
    /// last layer's output onto `resume.capture` when given.
    ///
    /// Measuring a model with one layer changed needs only the layers from that one on: the
    /// hidden states before it are the unchanged model's, recorded once by a capturing run
    /// from layer 0.
    pub fn forward_from(
        &self,
        b: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        batch: &BatchLayout,
        resume: Resume<'_, B>,
    ) -> Result<Vec<f32>, ModelError> {
        if resume.from > self.layers.len() || (resume.from > 0 && resume.input.is_none()) {
            return Err(ModelError::Forward(format!(
                "cannot resume at layer {} of {} without its input",
                resume.from,
                self.layers.len()
            )));
        }
        self.run(b, kv, tokens, batch, LogitsWanted::All, resume, &[])
    }

    /// Row runs of `batch` with their adapters: spans without one are left out, neighbouring
    /// spans running the same stack are merged.
    fn adapter_runs<'s>(
        &self,
        batch: &BatchLayout,
        adapters: &[Option<&'s AdapterStack>],
    ) -> Result<Vec<(std::ops::Range<usize>, &'s AdapterStack)>, ModelError> {
        if adapters.is_empty() {
            return Ok(Vec::new());
        }
        if adapters.len() != batch.spans.len() {
            return Err(ModelError::Forward(format!(
                "{} adapter stacks given for {} spans",
                adapters.len(),
                batch.spans.len()
            )));
        }
        let mut runs: Vec<(std::ops::Range<usize>, &AdapterStack)> = Vec::new();
        let mut row = 0;
        for (span, stack) in batch.spans.iter().zip(adapters) {
            let rows = row..row + span.n_tokens;
            row = rows.end;
            let Some(stack) = stack.filter(|s| !s.is_empty()) else {
                continue;
            };
            if !stack.fits(&self.config) {
                return Err(ModelError::Forward(format!(
                    "adapter {} does not fit this model",
                    stack.key()
                )));
            }
            match runs.last_mut() {
                Some((last, prev)) if last.end == rows.start && prev.same_as(stack) => {
                    last.end = rows.end;
                }
                _ => runs.push((rows, stack)),
            }
        }
        Ok(runs)
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        b: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        batch: &BatchLayout,
        want: LogitsWanted,
        resume: Resume<'_, B>,
        adapters: &[Option<&AdapterStack>],
    ) -> Result<Vec<f32>, ModelError> {
        let x = self.layers_out(b, kv, tokens, batch, resume, adapters)?;
        let rows: Vec<usize> = match want {
            LogitsWanted::All => (0..tokens.len()).collect(),
            LogitsWanted::LastOfEach => span_rows(batch, |start, n| start + n - 1),
        };
        let x = if rows.len() == tokens.len() {
            x
        } else {
            b.gather_rows(&x, &rows)
        };
        let x = self.final_norm(b, &x);
        let logits = b.matmul(&x, self.lm_head.as_ref().unwrap_or(&self.embed))?;
        for s in &batch.spans {
            kv.set_seq_len(s.slot, s.start_pos + s.n_tokens);
        }
        Ok(b.to_host(&logits))
    }

    fn final_norm(&self, b: &B, x: &B::Act) -> B::Act {
        match &self.norm {
            Some(norm) => b.rms_norm(
                x,
                norm,
                self.config.rms_norm_eps,
                self.config.norm_weight_offset,
            ),
            None => x.clone(),
        }
    }

    /// Runs `tokens` through the model (each span whole, from position 0 of its slot) and
    /// returns one pooled, final-normed state per span, row-major `[spans, hidden]`: the
    /// embeddings of an embedding model before any normalization; with rank pooling, one
    /// score per span. `types` are an encoder's token types (`None`: all 0; decoders have
    /// none).
    pub fn pooled(
        &self,
        b: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        types: Option<&[u32]>,
        batch: &BatchLayout,
        pooling: Pooling,
    ) -> Result<Vec<f32>, ModelError> {
        if batch.spans.iter().any(|s| s.start_pos != 0) {
            return Err(ModelError::Forward(
                "a pooled forward runs each input whole, from position 0".into(),
            ));
        }
        if let Some(enc) = &self.encoder {
            self.check_batch(kv, tokens, batch)?;
            for s in &batch.spans {
                kv.set_seq_len(s.slot, 0);
            }
            let out = enc.pooled(
                b,
                kv,
                &self.embed,
                &self.config,
                tokens,
                types,
                batch,
                pooling,
            )?;
            for s in &batch.spans {
                kv.set_seq_len(s.slot, s.n_tokens);
            }
            return Ok(out);
        }
        if types.is_some() {
            return Err(ModelError::Forward(
                "token types are an encoder's (BERT); a decoder has none".into(),
            ));
        }
        let x = self.layers_out(b, kv, tokens, batch, Resume::default(), &[])?;
        let h = self.config.hidden_size;
        let out = match pooling {
            Pooling::Last | Pooling::Cls => {
                let rows = match pooling {
                    Pooling::Last => span_rows(batch, |start, n| start + n - 1),
                    _ => span_rows(batch, |start, _| start),
                };
                b.to_host(&self.final_norm(b, &b.gather_rows(&x, &rows)))
            }
            Pooling::Mean => mean_rows(&b.to_host(&self.final_norm(b, &x)), batch, h),
            Pooling::Rank => {
                return Err(ModelError::Forward(
                    "rank pooling needs a cross-encoder (BERT with a classifier)".into(),
                ));
            }
        };
        for s in &batch.spans {
            kv.set_seq_len(s.slot, s.n_tokens);
        }
        Ok(out)
    }

    /// The last layer's output for every row of `batch` (embedding first unless `resume` gives
    /// the input), the slots' KV extended by the batch.
    fn layers_out(
        &self,
        b: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        batch: &BatchLayout,
        mut resume: Resume<'_, B>,
        adapters: &[Option<&AdapterStack>],
    ) -> Result<B::Act, ModelError> {
        self.check_batch(kv, tokens, batch)?;
        let adapter_runs = self.adapter_runs(batch, adapters)?;
        for s in &batch.spans {
            kv.set_seq_len(s.slot, s.start_pos);
        }
        let positions = batch.positions();
        let rope_global = RopeAngles::new(&positions, &self.inv_freq_global);
        // Most models use one frequency set; only compute a second table when they differ.
        let rope_local_own = (self.inv_freq_local != self.inv_freq_global)
            .then(|| RopeAngles::new(&positions, &self.inv_freq_local));
        let rope_local = rope_local_own.as_ref().unwrap_or(&rope_global);
        let ctx = ForwardCtx {
            cfg: &self.config,
            batch,
            rope_global: &rope_global,
            rope_local,
            adapters: &adapter_runs,
        };
        let mut x = match resume.input {
            Some(input) => input.clone(),
            None => b.embed(&self.embed, tokens, self.config.embedding_scale)?,
        };
        for (i, layer) in self.layers.iter().enumerate().skip(resume.from) {
            if let Some(c) = resume.capture.as_deref_mut() {
                c.push(x.clone());
            }
            decoder::forward_layer(b, layer, i, &mut x, kv, &ctx)?;
        }
        if let Some(c) = resume.capture {
            c.push(x.clone());
        }
        Ok(x)
    }

    fn check_batch(
        &self,
        kv: &B::Kv,
        tokens: &[u32],
        batch: &BatchLayout,
    ) -> Result<(), ModelError> {
        let layout = kv.layout();
        if tokens.is_empty() || tokens.len() != batch.total_tokens() {
            return Err(ModelError::Forward(format!(
                "batch layout covers {} tokens but {} were given",
                batch.total_tokens(),
                tokens.len()
            )));
        }
        if layout.n_layers != self.config.num_layers
            || layout.n_kv_heads != self.config.num_kv_heads
            || layout.head_dim != self.config.head_dim
        {
            return Err(ModelError::Forward(format!(
                "KV layout {layout:?} does not match the model"
            )));
        }
        let mut seen = vec![false; layout.n_slots];
        for s in &batch.spans {
            if s.slot >= layout.n_slots || std::mem::replace(&mut seen[s.slot], true) {
                return Err(ModelError::Forward(format!(
                    "slot {} is out of range or repeated",
                    s.slot
                )));
            }
            if s.n_tokens == 0 || s.start_pos > kv.seq_len(s.slot) {
                return Err(ModelError::Forward(format!(
                    "slot {} holds {} positions; a span cannot start at {}",
                    s.slot,
                    kv.seq_len(s.slot),
                    s.start_pos
                )));
            }
            if s.start_pos + s.n_tokens > layout.capacity {
                return Err(ModelError::Forward(format!(
                    "context full: {} positions requested, the KV cache holds {}",
                    s.start_pos + s.n_tokens,
                    layout.capacity
                )));
            }
        }
        if let Some(&t) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(ModelError::Forward(format!(
                "token id {t} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        Ok(())
    }
}

/// One row index per span of `batch`, from each span's first row and length.
pub(super) fn span_rows(batch: &BatchLayout, pick: impl Fn(usize, usize) -> usize) -> Vec<usize> {
    let mut start = 0;
    batch
        .spans
        .iter()
        .map(|s| {
            let row = pick(start, s.n_tokens);
            start += s.n_tokens;
            row
        })
        .collect()
}

/// The mean of each span's rows of `all` (row-major, `h` wide): mean pooling.
pub(super) fn mean_rows(all: &[f32], batch: &BatchLayout, h: usize) -> Vec<f32> {
    let mut out = vec![0f32; batch.spans.len() * h];
    let mut start = 0;
    for (i, s) in batch.spans.iter().enumerate() {
        let dst = &mut out[i * h..(i + 1) * h];
        for row in all[start * h..(start + s.n_tokens) * h].chunks_exact(h) {
            dst.iter_mut().zip(row).for_each(|(d, v)| *d += v);
        }
        dst.iter_mut().for_each(|d| *d /= s.n_tokens as f32);
        start += s.n_tokens;
    }
    out
}
