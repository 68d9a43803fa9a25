//! Arbitrary bytes as the JSON body of a generation request: the first byte picks the endpoint
//! (chat completions, completions, messages), the rest is the body. Parsing into the typed
//! request and every model-independent check after it (message normalisation, the Anthropic →
//! OpenAI conversion, stop strings) must return a request or an `ApiError`, never panic. The
//! same bytes are also read as model output by the tool-call parser.

#![no_main]

use axum::body::Bytes;
use kiln_server::anthropic::{MessagesRequest, to_openai};
use kiln_server::body::parse_request;
use kiln_server::errors::Flavor;
use kiln_server::openai::chat::ChatRequest;
use kiln_server::openai::completions::CompletionRequest;
use kiln_server::prompt::normalize_messages;
use kiln_server::sampling::parse_stop;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&endpoint, body)) = data.split_first() else {
        return;
    };
    let bytes = || Ok(Bytes::copy_from_slice(body));
    match endpoint % 3 {
        0 => {
            if let Ok(req) = parse_request::<ChatRequest>(bytes(), Flavor::OpenAi) {
                let _ = normalize_messages(&req.messages);
                let _ = parse_stop(req.stop.as_ref(), "stop");
            }
        }
        1 => {
            if let Ok(req) = parse_request::<CompletionRequest>(bytes(), Flavor::OpenAi) {
                let _ = parse_stop(req.stop.as_ref(), "stop");
            }
        }
        _ => {
            if let Ok(req) = parse_request::<MessagesRequest>(bytes(), Flavor::Anthropic) {
                if let Ok((messages, _tools)) = to_openai(&req) {
                    let _ = normalize_messages(&messages);
                }
                let _ = parse_stop(req.stop_sequences.as_ref(), "stop_sequences");
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(body) {
        let _ = kiln_server::tools::parse_tool_calls(text);
    }
});
