//! Log-probabilities in OpenAI's shapes (chosen over mlx_lm's id-keyed shape so the official
//! SDKs parse them; see docs/server.md).

use kiln_engine::request::TokenLogprob;
use kiln_model::tokenizer::KilnTokenizer;
use serde::Serialize;
use serde_json::{Map, Value};

fn token_text(tok: &KilnTokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok
        .token_bytes(id)
        .or_else(|| tok.token_to_piece(id).map(String::into_bytes))
        .unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// One token of chat `logprobs.content`; the alternatives carry no alternatives of their own.
#[derive(Serialize)]
pub struct TokenEntry {
    token: String,
    logprob: f32,
    bytes: Vec<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs: Option<Vec<TokenEntry>>,
}

fn entry(tok: &KilnTokenizer, id: u32, logprob: f32) -> TokenEntry {
    let (token, bytes) = token_text(tok, id);
    TokenEntry {
        token,
        logprob,
        bytes,
        top_logprobs: None,
    }
}

/// Chat `logprobs`: `{"content":[{token,logprob,bytes,top_logprobs:[…]}], "refusal": null}`.
#[derive(Serialize)]
pub struct ChatLogprobs {
    content: Vec<TokenEntry>,
    refusal: Option<String>,
}

/// Chat logprobs of `lps`.
pub fn chat(tok: &KilnTokenizer, lps: &[TokenLogprob]) -> ChatLogprobs {
    let content = lps
        .iter()
        .map(|lp| {
            let top = lp.top.iter().map(|&(id, l)| entry(tok, id, l)).collect();
            TokenEntry {
                top_logprobs: Some(top),
                ..entry(tok, lp.id, lp.logprob)
            }
        })
        .collect();
    ChatLogprobs {
        content,
        refusal: None,
    }
}

/// Legacy completions `logprobs`: `{tokens, token_logprobs, top_logprobs, text_offset}`;
/// `top_logprobs` maps each alternative's text to its logprob (null when none were asked for).
#[derive(Serialize)]
pub struct CompletionLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top_logprobs: Option<Vec<Map<String, Value>>>,
    text_offset: Vec<usize>,
}

/// Legacy completion logprobs of `lps`.
pub fn completion(tok: &KilnTokenizer, lps: &[TokenLogprob], want_top: bool) -> CompletionLogprobs {
    completion_from(tok, lps, want_top, &mut 0)
}

/// [`completion`] for tokens whose text starts at `offset` (a stream's later chunk); `offset`
/// moves past their text.
pub fn completion_from(
    tok: &KilnTokenizer,
    lps: &[TokenLogprob],
    want_top: bool,
    offset: &mut usize,
) -> CompletionLogprobs {
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
            m.insert(token_text(tok, id).0, Value::from(l));
        }
        tops.push(m);
    }
    CompletionLogprobs {
        tokens,
        token_logprobs,
        top_logprobs: want_top.then_some(tops),
        text_offset: offsets,
    }
}
