//! One module per verb.

pub mod bench;
pub mod generate;
pub mod models;
pub mod pull;
