//! Log-probabilities in OpenAI's shapes (chosen over mlx_lm's id-keyed shape so the official
//! SDKs parse them; see docs/server.md).

use kiln_engine::request::TokenLogprob;
use kiln_model::tokenizer::KilnTokenizer;
use serde_json::{Map, Value, json};

fn token_text(tok: &KilnTokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok
        .token_bytes(id)
        .or_else(|| tok.token_to_piece(id).map(String::into_bytes))
        .unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

fn entry(tok: &KilnTokenizer, id: u32, logprob: f32) -> Value {
    let (token, bytes) = token_text(tok, id);
    json!({"token": token, "logprob": logprob, "bytes": bytes})
}

/// Chat: `{"content":[{token,logprob,bytes,top_logprobs:[…]}], "refusal": null}`.
pub fn chat(tok: &KilnTokenizer, lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut e = entry(tok, lp.id, lp.logprob);
            let top: Vec<Value> = lp.top.iter().map(|&(id, l)| entry(tok, id, l)).collect();
            e["top_logprobs"] = Value::Array(top);
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Legacy completions: `{tokens, token_logprobs, top_logprobs, text_offset}`.
pub fn completion(tok: &KilnTokenizer, lps: &[TokenLogprob], want_top: bool) -> Value {
    completion_from(tok, lps, want_top, &mut 0)
}

/// [`completion`] for tokens whose text starts at `offset` (a stream's later chunk); `offset`
/// moves past their text.
pub fn completion_from(
    tok: &KilnTokenizer,
    lps: &[TokenLogprob],
    want_top: bool,
    offset: &mut usize,
) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for lp in lps {
        let (t, _) = token_text(tok, lp.id);
        offsets.push(*offset);
        *offset += t.len();
        tokens.push(t);
        token_logprobs.push(lp.logprob);
        let mut m = Map::new();
        for &(id, l) in &lp.top {
            m.insert(token_text(tok, id).0, json!(l));
        }
        tops.push(Value::Object(m));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": if want_top { Value::Array(tops) } else { Value::Null },
        "text_offset": offsets,
    })
}
