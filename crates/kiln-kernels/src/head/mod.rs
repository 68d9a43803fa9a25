//! The output head: quantized weights against activations that are not rounded to 8 bits,
//! since its logits feed the sampler directly. [`f32_acts`] keeps the activations in f32 on
//! any layout; [`i16_acts`] rounds them to 16 bits for a repacked Q8_0 head; [`q6_k_split`]
//! to 15 bits for a Q6_K head in the file layout.

pub mod f32_acts;
pub mod i16_acts;
pub mod q6_k_split;
