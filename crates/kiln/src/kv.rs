//! The KV-cache flags every verb that runs or sizes a model shares, and their resolution into a
//! scheme (spec §6.1 with the server's wiring: no `--kv-quant` means the model's
//! `kv_config.json` when it has one, else dense).

use std::path::Path;

use anyhow::{Result, bail};
use clap::Args;
use kiln_engine::kv_scheme::{
    DenseDtype, KvModelShape, KvQuantOverride, KvScheme, KvSchemeRequest, MissingConfig,
    TurboQuant, load_kv_config, resolve_kv_scheme,
};
use kiln_model::config::ModelConfig;

/// KV-cache scheme flags.
#[derive(Debug, Args, Clone, Default)]
pub struct KvArgs {
    /// KV-cache scheme: off (dense), 4 or 8 (affine, every layer), config (the model's
    /// kv_config.json), turbo (TurboQuant). Default: config when the model has a
    /// kv_config.json, else off.
    #[arg(long)]
    pub kv_quant: Option<String>,
    /// Affine group size for --kv-quant 4|8: 32, 64 (default) or 128.
    #[arg(long)]
    pub kv_group_size: Option<usize>,
    /// Cache length at which a sequence's cache is quantized (default 0 for these flags).
    #[arg(long, allow_hyphen_values = true)]
    pub quantized_kv_start: Option<i64>,
    /// TurboQuant key bits: 2, 3, 4, 5 or 8 (with --kv-quant turbo; default 8).
    #[arg(long)]
    pub turbo_k_bits: Option<u8>,
    /// TurboQuant value bits: 2, 3, 4, 5 or 8 (with --kv-quant turbo; default 3).
    #[arg(long)]
    pub turbo_v_bits: Option<u8>,
    /// Storage of dense layers and of every layer before conversion: f16 (default), bf16, f32.
    #[arg(long, default_value = "f16")]
    pub kv_dtype: String,
}

impl KvArgs {
    /// The scheme request these flags make, given the model's `kv_config.json` entries.
    pub fn request<'a>(
        &self,
        config: Option<&'a [kiln_engine::kv_scheme::KvQuantSpec]>,
    ) -> Result<KvSchemeRequest<'a>> {
        let Some(dense) = DenseDtype::parse(&self.kv_dtype) else {
            bail!(
                "--kv-dtype must be f32, f16 or bf16, got {:?}",
                self.kv_dtype
            );
        };
        let (kv_quant, turbo, missing_config) = match self.kv_quant.as_deref() {
            // Unset: the server's serial default, which the user did not ask for by name.
            None => (KvQuantOverride::Config, None, MissingConfig::Dense),
            Some("off") => (KvQuantOverride::Off, None, MissingConfig::Error),
            Some("config") => (KvQuantOverride::Config, None, MissingConfig::Error),
            Some("turbo") => (
                KvQuantOverride::Off,
                Some(TurboQuant {
                    k_bits: self.turbo_k_bits.unwrap_or(TurboQuant::DEFAULT.k_bits),
                    v_bits: self.turbo_v_bits.unwrap_or(TurboQuant::DEFAULT.v_bits),
                }),
                MissingConfig::Error,
            ),
            Some(other) => match other.parse::<u8>() {
                Ok(bits) => (KvQuantOverride::Bits(bits), None, MissingConfig::Error),
                Err(_) => bail!("--kv-quant must be off, 4, 8, config or turbo, got {other:?}"),
            },
        };
        if turbo.is_none() && (self.turbo_k_bits.is_some() || self.turbo_v_bits.is_some()) {
            bail!("--turbo-k-bits and --turbo-v-bits apply only to --kv-quant turbo");
        }
        Ok(KvSchemeRequest {
            kv_quant: Some(kv_quant),
            turbo,
            config,
            missing_config,
            quantized_kv_start: self.quantized_kv_start,
            kv_group_size: self.kv_group_size,
            dense,
        })
    }

    /// Resolves the scheme for the model at `path` and checks that it applies to every layer.
    pub fn resolve(&self, path: &Path, cfg: &ModelConfig) -> Result<KvScheme> {
        // Only a scheme that can use `kv_config.json` reads it: `--kv-quant off` must work
        // beside a broken file.
        let kv_config = match self.kv_quant.as_deref() {
            None | Some("config") => load_kv_config(path, cfg.num_layers)?,
            Some(_) => None,
        };
        let scheme = resolve_kv_scheme(&self.request(kv_config.as_deref())?)?;
        scheme.check_model(&KvModelShape::from_config(cfg), cfg.head_dim)?;
        Ok(scheme)
    }
}
