//! The OpenAI surface: `/v1/chat/completions`, `/v1/completions` and `/v1/responses`.

pub mod chat;
mod chat_stream;
pub mod completions;
pub mod logprobs;
pub mod responses;

use kiln_engine::GenerateOutput;
use serde_json::{Value, json};

/// OpenAI `usage`, with the reused prefix as `prompt_tokens_details.cached_tokens`.
pub fn usage(out: &GenerateOutput) -> Value {
    let p = out.stats.prompt_tokens;
    let n = out.tokens.len();
    json!({
        "prompt_tokens": p,
        "completion_tokens": n,
        "total_tokens": p + n,
        "prompt_tokens_details": {"cached_tokens": out.stats.cached_tokens},
    })
}
