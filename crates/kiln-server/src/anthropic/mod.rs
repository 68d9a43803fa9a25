//! The Anthropic surface: `/v1/messages` and `/v1/messages/count_tokens`.

mod convert;
pub mod messages;
mod stream;

pub use convert::{MessagesRequest, to_openai};
