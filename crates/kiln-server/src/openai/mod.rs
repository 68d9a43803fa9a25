//! The OpenAI surface: `/v1/chat/completions`, `/v1/completions` and `/v1/responses`.

pub mod chat;
mod chat_stream;
pub mod completions;
pub mod logprobs;
pub mod responses;

use kiln_engine::GenerateOutput;
use serde::Serialize;

/// OpenAI `usage` of chat and legacy completions.
#[derive(Serialize)]
pub struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: CachedTokens,
}

/// The reused prefix, as `*_tokens_details.cached_tokens`.
#[derive(Serialize)]
pub struct CachedTokens {
    cached_tokens: usize,
}

impl CachedTokens {
    /// `cached_tokens` reused prompt tokens.
    pub fn new(cached_tokens: usize) -> Self {
        Self { cached_tokens }
    }
}

/// OpenAI `usage`, with the reused prefix as `prompt_tokens_details.cached_tokens`.
pub fn usage(out: &GenerateOutput) -> Usage {
    let p = out.stats.prompt_tokens;
    let n = out.tokens.len();
    Usage {
        prompt_tokens: p,
        completion_tokens: n,
        total_tokens: p + n,
        prompt_tokens_details: CachedTokens::new(out.stats.cached_tokens),
    }
}
