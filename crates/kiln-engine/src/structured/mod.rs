//! Structured output: a grammar (a JSON schema, or a Lark grammar for tool-call markup) compiled
//! by llguidance against the model's vocabulary, and the per-sequence constraint that masks
//! every token the grammar forbids before the sampler sees the logits.
//!
//! The server compiles a request's grammar before submitting it, so a schema llguidance cannot
//! handle is refused with its message instead of being ignored; the compiled [`Grammar`] rides
//! in the [`crate::GenerateRequest`], and each sequence runs its own copy.

mod vocab;

use std::fmt;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

/// Why a grammar could not be built or followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The vocabulary cannot be turned into llguidance's trie.
    #[error("structured output is unavailable for this model: {0}")]
    Vocabulary(String),
    /// The schema or grammar is invalid or uses something llguidance does not support.
    #[error("{0}")]
    Invalid(String),
    /// The grammar failed while generating (an internal limit, or a state it cannot leave).
    #[error("the output constraint failed: {0}")]
    Runtime(String),
}

/// What to constrain output to.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON value matching this JSON schema (`{"type":"object"}` for any object).
    JsonSchema(Value),
    /// A Lark grammar (llguidance's dialect; may embed `%json {…}` schemas).
    Lark(String),
}

/// Compiles grammars for one model's vocabulary (built once per model; cheap to share).
pub struct GrammarCompiler {
    factory: ParserFactory,
    env: toktrie::TokEnv,
}

impl fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GrammarCompiler")
    }
}

/// JSON layout the schemas compile to: the separators models write by habit, and no free
/// whitespace, so a small model cannot wander into endless blank space.
const JSON_LAYOUT: &str =
    r#"{"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false}"#;

impl GrammarCompiler {
    /// A compiler for `tokenizer` over `vocab_size` logits per row.
    pub fn new(
        tokenizer: &kiln_model::tokenizer::KilnTokenizer,
        vocab_size: usize,
    ) -> Result<Self, GrammarError> {
        // The trie builder asserts on inconsistent input; a hostile vocabulary must not panic.
        let env = std::panic::catch_unwind(|| vocab::tok_env(tokenizer, vocab_size)).map_err(
            |_| GrammarError::Vocabulary("the vocabulary could not be indexed".into()),
        )??;
        let mut factory = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ParserFactory::new_simple(&env)
        }))
        .map_err(|_| GrammarError::Vocabulary("the vocabulary could not be indexed".into()))?
        .map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self { factory, env })
    }

    /// Compiles `spec` as a lazy grammar: output is free until it contains `trigger` (a
    /// tool-call marker, or `</think>`), then what follows the trigger must match `spec`. With
    /// `ends_answer` the answer ends when that match is complete (an answer after reasoning);
    /// without, the output is free again and the trigger may start another match (tool calls).
    pub fn compile_lazy(
        &self,
        spec: &GrammarSpec,
        trigger: &str,
        ends_answer: bool,
    ) -> Result<Grammar, GrammarError> {
        if trigger.is_empty() {
            return Err(GrammarError::Invalid(
                "a lazy grammar needs a trigger".into(),
            ));
        }
        let mut g = self.compile(spec)?;
        g.lazy = Some(Arc::new(Lazy {
            trigger: trigger.as_bytes().to_vec(),
            env: self.env.clone(),
            ends_answer,
        }));
        Ok(g)
    }

    /// Compiles `spec`; errors name what in it is wrong or unsupported.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let grammar = match spec {
            GrammarSpec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_layout(schema)?)
            }
            GrammarSpec::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
        };
        let factory = &self.factory;
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            factory.create_parser(grammar)
        }))
        .map_err(|_| GrammarError::Invalid("the grammar could not be compiled".into()))?
        .map_err(|e| GrammarError::Invalid(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        // A grammar that admits nothing fails on its first mask: refuse it now, not mid-stream.
        let first = matcher
            .compute_mask()
            .map_err(|e| GrammarError::Invalid(e.to_string()))?;
        if first.num_set() == 0 {
            return Err(GrammarError::Invalid(
                "the schema admits no output".to_string(),
            ));
        }
        Ok(Grammar {
            matcher: matcher.deep_clone(),
            lazy: None,
        })
    }
}

/// A schema with kiln's JSON layout, unless the schema sets its own `x-guidance`.
fn with_layout(schema: &Value) -> Result<Value, GrammarError> {
    let mut schema = match schema {
        Value::Object(_) => schema.clone(),
        Value::Bool(true) => serde_json::json!({}),
        _ => {
            return Err(GrammarError::Invalid(
                "a JSON schema must be an object".into(),
            ));
        }
    };
    if let Some(obj) = schema.as_object_mut()
        && !obj.contains_key("x-guidance")
    {
        let layout: Value =
            serde_json::from_str(JSON_LAYOUT).map_err(|e| GrammarError::Invalid(e.to_string()))?;
        obj.insert("x-guidance".into(), layout);
    }
    Ok(schema)
}

/// A compiled grammar, ready to constrain any number of sequences.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    lazy: Option<Arc<Lazy>>,
}

/// What a lazy grammar waits for, and the vocabulary to re-tokenize the bytes after it.
struct Lazy {
    trigger: Vec<u8>,
    env: toktrie::TokEnv,
    /// The completed match ends the answer (else the output is free again).
    ends_answer: bool,
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Grammar")
    }
}

impl PartialEq for Grammar {
    /// Grammars are not compared by content; two requests are equal only without one.
    fn eq(&self, _: &Self) -> bool {
        false
    }
}

impl Grammar {
    /// A fresh constraint for one sequence.
    pub fn start(&self) -> Constraint {
        Constraint {
            matcher: self.matcher.deep_clone(),
            lazy: self.lazy.as_ref().map(|l| LazyState {
                lazy: l.clone(),
                fresh: self.matcher.clone(),
                active: false,
                tail: Vec::new(),
            }),
        }
    }
}

/// One sequence's position in its grammar.
pub struct Constraint {
    matcher: Matcher,
    lazy: Option<LazyState>,
}

/// A lazy constraint's state: waiting for the trigger (with the recent output bytes), or
/// matching.
struct LazyState {
    lazy: Arc<Lazy>,
    fresh: Matcher,
    active: bool,
    tail: Vec<u8>,
}

impl Constraint {
    /// Whether the grammar is complete and admits nothing more (generation should end). A
    /// lazy grammar ends generation only if it ends the answer, once triggered.
    pub fn finished(&self) -> bool {
        match &self.lazy {
            None => self.matcher.is_stopped(),
            Some(l) => l.lazy.ends_answer && l.active && self.matcher.is_stopped(),
        }
    }

    /// Whether the grammar constrains the next token (a lazy one only once triggered).
    pub fn active(&self) -> bool {
        self.lazy.as_ref().is_none_or(|l| l.active)
    }

    /// Sets the logit of every token the grammar forbids now to `-inf`. At a point where the
    /// grammar may end, the end-of-sequence tokens stay allowed.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        if !self.active() {
            return Ok(());
        }
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Runtime(e.to_string()))?;
        let n = allowed.len().min(logits.len());
        allowed.iter_unset_entries(|i| {
            if i < n {
                logits[i] = f32::NEG_INFINITY;
            }
        });
        // Padding rows past the grammar's vocabulary are never text.
        for l in logits.iter_mut().skip(allowed.len()) {
            *l = f32::NEG_INFINITY;
        }
        Ok(())
    }

    /// Advances past the sampled `token` (a lazy grammar watches its bytes for the trigger).
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        let Some(l) = &mut self.lazy else {
            return self.matcher.consume_token(token).map_err(runtime);
        };
        if l.active {
            self.matcher.consume_token(token).map_err(runtime)?;
            if l.lazy.ends_answer {
                // From the trigger on it is an ordinary constraint.
                return Ok(());
            }
            if self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false) {
                // The call is complete: free text again, and a new match on the next trigger.
                l.active = false;
                l.tail.clear();
                self.matcher = l.fresh.deep_clone();
            }
            return Ok(());
        }
        l.tail.extend_from_slice(l.lazy.env.tok_trie().token(token));
        let Some(at) = find(&l.tail, &l.lazy.trigger) else {
            // Keep only what could still hold the start of the trigger.
            let keep = l.lazy.trigger.len().saturating_sub(1);
            let cut = l.tail.len().saturating_sub(keep);
            l.tail.drain(..cut);
            return Ok(());
        };
        // Triggered: the bytes after the trigger (the rest of this token) are the grammar's
        // first bytes; the grammar reads bytes, so their own tokenization feeds it.
        let mut rest = &l.tail[at + l.lazy.trigger.len()..];
        if l.lazy.ends_answer {
            // An answer after `</think>` may start with a blank line the grammar does not admit.
            while let [b, tail @ ..] = rest
                && b.is_ascii_whitespace()
            {
                rest = tail;
            }
        }
        // The grammar reads bytes, so any split of them will do (the tokenizer's own would add
        // SentencePiece's leading space).
        let tokens = l.lazy.env.tok_trie().greedy_tokenize(rest);
        l.tail.clear();
        l.active = true;
        if self.matcher.consume_tokens(&tokens).is_err() {
            if l.lazy.ends_answer {
                return Err(runtime(
                    "the text after the trigger does not match the grammar",
                ));
            }
            // What followed the trigger is not the call's shape: leave this one free.
            l.active = false;
            self.matcher = l.fresh.deep_clone();
        }
        Ok(())
    }
}

fn runtime(e: impl fmt::Display) -> GrammarError {
    GrammarError::Runtime(e.to_string())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
