//! The quantize job: uniform or mixed-precision (measured-sensitivity) quantization of a model
//! into GGUF or MLX affine safetensors.

pub mod allocate;
mod assign;
pub mod calibration;
pub mod config;
pub mod evaluate;
pub mod gguf_out;
pub mod hf_export;
pub mod job;
mod measure;
pub mod mlx_out;
pub mod plan;
pub mod preview;
pub mod run;
pub mod sensitivity;
pub mod st_writer;
mod write;

pub use config::{OutputFormat, QuantizeConfig};
pub use run::{QuantizeReport, quantize};
