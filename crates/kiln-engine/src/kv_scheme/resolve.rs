//! `resolve_kv_scheme`: the seed's `resolveKvScheme` (spec §6.1), plus kiln's group-size option.

use super::{
    AFFINE_KV_BITS, DenseDtype, KV_GROUP_SIZES, KvQuantSpec, KvScheme, KvSchemeError, KvSchemeKind,
    KvSchemeOptions, TurboQuant,
};

/// The largest integer a JSON number (an f64) holds exactly: the seed's `Number.isSafeInteger`.
const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// What `--kv-quant` asked for (`turbo` travels as [`KvSchemeRequest::turbo`], as in the seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvQuantOverride {
    /// `off`: dense.
    Off,
    /// `4` or `8`: affine-uniform.
    Bits(u8),
    /// `config`: the model's `kv_config.json`.
    Config,
}

/// What to do when `config` is asked for and the model has no `kv_config.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingConfig {
    /// Fall back to dense (the server's default scheme, which the user did not ask for).
    #[default]
    Dense,
    /// Refuse: the user asked for `--kv-quant config` explicitly.
    Error,
}

/// The inputs of [`resolve_kv_scheme`].
#[derive(Debug, Clone, Default)]
pub struct KvSchemeRequest<'a> {
    /// `--kv-quant`, if given.
    pub kv_quant: Option<KvQuantOverride>,
    /// TurboQuant widths; when given the scheme is turbo whatever `kv_quant` says.
    pub turbo: Option<TurboQuant>,
    /// The model's `kv_config.json` entries, if it has the file.
    pub config: Option<&'a [KvQuantSpec]>,
    /// What a missing config means.
    pub missing_config: MissingConfig,
    /// `--quantized-kv-start`, signed so that a negative value from JSON is refused with the
    /// seed's message rather than wrapped.
    pub quantized_kv_start: Option<i64>,
    /// `--kv-group-size` (affine-uniform only).
    pub kv_group_size: Option<usize>,
    /// Dense storage dtype.
    pub dense: DenseDtype,
}

/// Resolves the scheme with the seed's rules (spec §6.1):
/// a start, when given, must be a nonnegative safe integer; turbo wins and starts at `start ?? 0`;
/// `off`/unset is dense; `config` is affine-config (the start only if given) or, with no entries,
/// dense or an error; a bit width is affine-uniform starting at `start ?? 0`.
pub fn resolve_kv_scheme(req: &KvSchemeRequest<'_>) -> Result<KvScheme, KvSchemeError> {
    let start = match req.quantized_kv_start {
        None => None,
        Some(s) if (0..=MAX_SAFE_INTEGER).contains(&s) => Some(s as usize),
        Some(s) => return Err(KvSchemeError::BadStart(s)),
    };
    let uniform = matches!(req.kv_quant, Some(KvQuantOverride::Bits(_))) && req.turbo.is_none();
    if req.kv_group_size.is_some() && !uniform {
        // Seed schemes other than uniform take their group sizes from elsewhere (config entries)
        // or have none; silently dropping the flag would hide a mistake.
        return Err(KvSchemeError::Unused {
            option: "--kv-group-size",
            applies_to: "--kv-quant 4|8",
        });
    }
    let base = KvSchemeOptions {
        dense: req.dense,
        ..KvSchemeOptions::default()
    };
    if let Some(turbo) = req.turbo {
        return Ok(KvScheme {
            kind: KvSchemeKind::Turbo,
            options: KvSchemeOptions {
                turbo: Some(turbo.validate()?),
                quantized_kv_start: Some(start.unwrap_or(0)),
                ..base
            },
        });
    }
    match req.kv_quant {
        None | Some(KvQuantOverride::Off) => Ok(KvScheme::dense(req.dense)),
        Some(KvQuantOverride::Config) => match req.config {
            Some(entries) if !entries.is_empty() => Ok(KvScheme {
                kind: KvSchemeKind::AffineConfig,
                options: KvSchemeOptions {
                    kv_config: Some(entries.to_vec()),
                    quantized_kv_start: start,
                    ..base
                },
            }),
            _ => match req.missing_config {
                MissingConfig::Error => Err(KvSchemeError::MissingConfig),
                MissingConfig::Dense => Ok(KvScheme::dense(req.dense)),
            },
        },
        Some(KvQuantOverride::Bits(bits)) => {
            if !AFFINE_KV_BITS.contains(&bits) {
                return Err(KvSchemeError::BadBits(bits));
            }
            if let Some(g) = req.kv_group_size
                && !KV_GROUP_SIZES.contains(&g)
            {
                return Err(KvSchemeError::BadGroupSize(g));
            }
            Ok(KvScheme {
                kind: KvSchemeKind::AffineUniform,
                options: KvSchemeOptions {
                    kv_bits: Some(bits),
                    kv_group_size: req.kv_group_size,
                    // The flag path starts at 0 (the seed's `start ?? 0`); the 5000 default only
                    // applies to a uniform scheme built without a start.
                    quantized_kv_start: Some(start.unwrap_or(0)),
                    ..base
                },
            })
        }
    }
}
