//! One module per verb.

pub mod bench;
pub mod dataset;
pub mod embed;
pub mod eval;
pub mod fit;
pub mod fuse;
pub mod generate;
pub mod jobs;
pub mod models;
pub mod pull;
pub mod quantize;
pub mod serve;
pub mod train;
