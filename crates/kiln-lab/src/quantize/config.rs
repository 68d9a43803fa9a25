//! The quantize job's configuration: one struct for the CLI and the job, parsed from the job's
//! snake_case JSON and checked field by field before anything runs.

use std::path::{Path, PathBuf};

use kiln_kernels::GgmlType;
use serde_json::{Map, Value};

use crate::LabError;

/// The file format a quantize run writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// One GGUF file, readable by llama.cpp.
    Gguf,
    /// An MLX folder: affine-quantized safetensors plus `config.json`'s `quantization` block.
    Mlx,
}

impl OutputFormat {
    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            OutputFormat::Gguf => "gguf",
            OutputFormat::Mlx => "mlx",
        }
    }
}

/// Code widths a mixed allocation may choose from (both formats map each to a layout).
pub const CANDIDATE_WIDTHS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes MLX's affine quantizer takes.
pub const GROUP_SIZES: [usize; 3] = [32, 64, 128];
/// GGUF types a uniform run can write.
pub const GGUF_TYPES: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Everything a quantize run needs.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeConfig {
    /// The model to quantize: a GGUF file or a Hugging Face / MLX folder.
    pub source: PathBuf,
    /// Where the result goes (a `.gguf` file or a folder); must not exist yet.
    pub out: PathBuf,
    /// GGUF or MLX.
    pub format: OutputFormat,
    /// Uniform width (4 or 8), also the width of modules a mixed allocation leaves out.
    pub bits: u32,
    /// MLX group size (32, 64 or 128).
    pub group_size: usize,
    /// The GGUF type of a uniform run (default: Q4_K for 4 bits, Q8_0 for 8).
    pub gguf_type: Option<GgmlType>,
    /// Mixed precision: the bits-per-weight floor the allocator reaches.
    pub target_bpw: Option<f64>,
    /// Mixed precision: the widths to choose from (default 2, 3, 4, 5, 6, 8).
    pub candidate_bits: Option<Vec<u32>>,
    /// A calibration text or JSONL file (`text` or `messages` records); default: built in.
    pub calibration: Option<PathBuf>,
    /// Calibration chunks measured per candidate.
    pub n_calibration: usize,
    /// Tokens per calibration chunk.
    pub seq_len: usize,
    /// Mixed precision: reuse the sensitivity an earlier run measured (its `--json` report or
    /// `optiq_metadata.json`) instead of measuring again.
    pub sensitivity_from: Option<PathBuf>,
    /// Mixed precision: give the first and last blocks optiq's ×100 priority (default: when
    /// they are at most a quarter of the blocks).
    pub protect_boundary_blocks: Option<bool>,
    /// After writing, measure the result's KL and top-1 agreement against the source.
    pub evaluate: bool,
}

impl QuantizeConfig {
    /// Defaults for `source` → `out`.
    pub fn new(source: PathBuf, out: PathBuf, format: OutputFormat) -> Self {
        QuantizeConfig {
            source,
            out,
            format,
            bits: 4,
            group_size: 64,
            gguf_type: None,
            target_bpw: None,
            candidate_bits: None,
            calibration: None,
            n_calibration: 2,
            seq_len: 128,
            sensitivity_from: None,
            protect_boundary_blocks: None,
            evaluate: false,
        }
    }

    /// The uniform GGUF type: the configured one, else by `bits`.
    pub fn uniform_gguf_type(&self) -> GgmlType {
        self.gguf_type.unwrap_or(if self.bits == 8 {
            GgmlType::Q8_0
        } else {
            GgmlType::Q4_K
        })
    }

    /// The widths a mixed allocation chooses from.
    pub fn candidates(&self) -> Vec<u32> {
        let mut c = self
            .candidate_bits
            .clone()
            .unwrap_or_else(|| match self.format {
                OutputFormat::Gguf => CANDIDATE_WIDTHS.to_vec(),
                OutputFormat::Mlx => CANDIDATE_WIDTHS.to_vec(),
            });
        c.sort_unstable();
        c.dedup();
        c
    }

    /// Parses the job config (`model_id` or `src_dir`, `out_dir`, `format`, `bits`,
    /// `group_size`, `gguf_type`, `target_bpw`, `candidate_bits`, `calibration`,
    /// `n_calibration`, `seq_len`) and validates it. A `model_id` that is not a path is looked
    /// up with `resolve` (a model name or `org/name`); `default_out` names the output when
    /// `out_dir` is absent.
    pub fn from_json(
        map: &Map<String, Value>,
        resolve: &dyn Fn(&str) -> Option<PathBuf>,
        default_out: impl FnOnce(&Path, OutputFormat, &str) -> PathBuf,
    ) -> Result<Self, LabError> {
        let cfg = Self::parse_json(map, resolve, default_out)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// [`QuantizeConfig::from_json`] without the checks that touch the file system: types and
    /// known keys only (the fuzz target's entry point).
    pub fn parse_json(
        map: &Map<String, Value>,
        resolve: &dyn Fn(&str) -> Option<PathBuf>,
        default_out: impl FnOnce(&Path, OutputFormat, &str) -> PathBuf,
    ) -> Result<Self, LabError> {
        for key in map.keys() {
            if !KNOWN_KEYS.contains(&key.as_str()) {
                return Err(LabError::config(key, "unknown field"));
            }
        }
        let source = match (opt_str(map, "src_dir")?, opt_str(map, "model_id")?) {
            (Some(s), _) => PathBuf::from(s),
            (None, Some(s)) if Path::new(s).exists() => PathBuf::from(s),
            (None, Some(s)) => resolve(s).unwrap_or_else(|| PathBuf::from(s)),
            (None, None) => return Err(LabError::config("model_id", "missing")),
        };
        let format = match opt_str(map, "format")?.unwrap_or("gguf") {
            "gguf" => OutputFormat::Gguf,
            "mlx" => OutputFormat::Mlx,
            other => {
                return Err(LabError::config(
                    "format",
                    format!("{other:?}: gguf or mlx"),
                ));
            }
        };
        let mut cfg = QuantizeConfig::new(source, PathBuf::new(), format);
        if let Some(b) = opt_u64(map, "bits")? {
            cfg.bits = u32::try_from(b).unwrap_or(u32::MAX);
        }
        if let Some(g) = opt_u64(map, "group_size")? {
            cfg.group_size = usize::try_from(g).unwrap_or(usize::MAX);
        }
        if let Some(t) = opt_str(map, "gguf_type")? {
            cfg.gguf_type = Some(parse_gguf_type(t)?);
        }
        cfg.target_bpw = opt_f64(map, "target_bpw")?;
        cfg.candidate_bits = opt_bits_list(map, "candidate_bits")?;
        cfg.calibration = opt_str(map, "calibration")?.map(PathBuf::from);
        if let Some(n) = opt_u64(map, "n_calibration")? {
            cfg.n_calibration = usize::try_from(n).unwrap_or(usize::MAX);
        }
        cfg.sensitivity_from = opt_str(map, "sensitivity_from")?.map(PathBuf::from);
        match opt_str(map, "reference")? {
            None | Some("auto" | "bf16") => {}
            Some(other) => {
                return Err(LabError::config(
                    "reference",
                    format!(
                        "{other:?}: kiln measures against the unquantized weights (auto or bf16)"
                    ),
                ));
            }
        }
        if map.get("calibration_mix").is_some_and(|v| !v.is_null()) {
            return Err(LabError::config(
                "calibration_mix",
                "not supported; give a text or JSONL file as `calibration`",
            ));
        }
        cfg.protect_boundary_blocks = match map.get("protect_boundary_blocks") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(v) => {
                return Err(LabError::config(
                    "protect_boundary_blocks",
                    format!("expected a bool, found {v}"),
                ));
            }
        };
        cfg.evaluate = match map.get("evaluate") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(LabError::config(
                    "evaluate",
                    format!("expected a bool, found {v}"),
                ));
            }
        };
        if let Some(n) = opt_u64(map, "seq_len")? {
            cfg.seq_len = usize::try_from(n).unwrap_or(usize::MAX);
        }
        cfg.out = match opt_str(map, "out_dir")? {
            Some(o) => PathBuf::from(o),
            None => default_out(&cfg.source, cfg.format, &cfg.name_suffix()),
        };
        Ok(cfg)
    }

    /// `mixed-<bpw>bpw` or `<bits>bit` (spec §7.6), used in default output names.
    pub fn name_suffix(&self) -> String {
        match self.target_bpw {
            Some(t) => format!("mixed-{t}bpw"),
            None if self.format == OutputFormat::Gguf => {
                self.uniform_gguf_type().name().to_string()
            }
            None => format!("{}bit", self.bits),
        }
    }

    /// Checks every field; the error names the first one that is wrong.
    pub fn validate(&self) -> Result<(), LabError> {
        if ![4, 8].contains(&self.bits) {
            return Err(LabError::config("bits", format!("{}: 4 or 8", self.bits)));
        }
        if !GROUP_SIZES.contains(&self.group_size) {
            return Err(LabError::config(
                "group_size",
                format!("{}: 32, 64 or 128", self.group_size),
            ));
        }
        if let Some(t) = self.target_bpw
            && !(t.is_finite() && (1.0..=16.0).contains(&t))
        {
            return Err(LabError::config(
                "target_bpw",
                format!("{t}: between 1 and 16"),
            ));
        }
        if let Some(c) = &self.candidate_bits {
            if c.is_empty() {
                return Err(LabError::config("candidate_bits", "empty"));
            }
            if let Some(b) = c.iter().find(|b| !CANDIDATE_WIDTHS.contains(b)) {
                return Err(LabError::config(
                    "candidate_bits",
                    format!("{b}: each must be one of 2, 3, 4, 5, 6, 8"),
                ));
            }
        }
        if !(1..=4096).contains(&self.n_calibration) {
            return Err(LabError::config("n_calibration", "between 1 and 4096"));
        }
        if !(16..=8192).contains(&self.seq_len) {
            return Err(LabError::config("seq_len", "between 16 and 8192"));
        }
        if !self.source.exists() {
            return Err(LabError::config(
                "model_id",
                format!("{}: no such file or folder", self.source.display()),
            ));
        }
        if let Some(c) = &self.calibration
            && !c.is_file()
        {
            return Err(LabError::config(
                "calibration",
                format!("{}: no such file", c.display()),
            ));
        }
        if let Some(p) = &self.sensitivity_from
            && !p.is_file()
        {
            return Err(LabError::config(
                "sensitivity_from",
                format!("{}: no such file", p.display()),
            ));
        }
        check_output(&self.out)
    }
}

const KNOWN_KEYS: [&str; 17] = [
    "evaluate",
    "reference",
    "protect_boundary_blocks",
    "sensitivity_from",
    "model_id",
    "src_dir",
    "out_dir",
    "format",
    "bits",
    "group_size",
    "gguf_type",
    "target_bpw",
    "candidate_bits",
    "calibration",
    "calibration_mix",
    "n_calibration",
    "seq_len",
];

/// The output must not exist, and its folder must exist and take a new file.
fn check_output(out: &Path) -> Result<(), LabError> {
    if out.as_os_str().is_empty() {
        return Err(LabError::config("out_dir", "empty"));
    }
    if out.exists() {
        return Err(LabError::config(
            "out_dir",
            format!(
                "{} already exists; kiln does not overwrite it",
                out.display()
            ),
        ));
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let probe = parent.join(format!(".kiln-write-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(LabError::config(
            "out_dir",
            format!("{} is not writable: {e}", parent.display()),
        )),
    }
}

/// Parses a GGUF type name such as `Q4_K` (case-insensitive, `q4_k_m` style suffixes refused).
pub fn parse_gguf_type(name: &str) -> Result<GgmlType, LabError> {
    GGUF_TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            LabError::config(
                "gguf_type",
                format!(
                    "{name:?}: one of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"
                ),
            )
        })
}

fn opt_str<'a>(map: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, LabError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(LabError::config(
            key,
            format!("expected a string, found {v}"),
        )),
    }
}

fn opt_u64(map: &Map<String, Value>, key: &str) -> Result<Option<u64>, LabError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            LabError::config(key, format!("expected a non-negative integer, found {v}"))
        }),
    }
}

fn opt_f64(map: &Map<String, Value>, key: &str) -> Result<Option<f64>, LabError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| LabError::config(key, format!("expected a number, found {v}"))),
    }
}

fn opt_bits_list(map: &Map<String, Value>, key: &str) -> Result<Option<Vec<u32>>, LabError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|b| u32::try_from(b).ok())
                    .ok_or_else(|| LabError::config(key, format!("{v} is not a bit width")))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(v) => Err(LabError::config(key, format!("expected a list, found {v}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<QuantizeConfig, LabError> {
        let dir = std::env::temp_dir();
        let Value::Object(map) = v else {
            unreachable!()
        };
        QuantizeConfig::from_json(&map, &|_| None, |_, _, suffix| {
            dir.join(format!("kiln-cfg-test-{suffix}"))
        })
    }

    fn field_of(v: Value) -> String {
        match parse(v) {
            Err(LabError::Config { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let src = env!("CARGO_MANIFEST_DIR");
        assert_eq!(field_of(json!({"model_id": src, "bits": 7})), "bits");
        assert_eq!(
            field_of(json!({"model_id": src, "group_size": 48})),
            "group_size"
        );
        assert_eq!(field_of(json!({"model_id": src, "bits": "4"})), "bits");
        assert_eq!(
            field_of(json!({"model_id": src, "target_bpw": 0.5})),
            "target_bpw"
        );
        assert_eq!(
            field_of(json!({"model_id": src, "candidate_bits": []})),
            "candidate_bits"
        );
        assert_eq!(
            field_of(json!({"model_id": src, "candidate_bits": [4, 7]})),
            "candidate_bits"
        );
        assert_eq!(
            field_of(json!({"model_id": src, "format": "onnx"})),
            "format"
        );
        assert_eq!(
            field_of(json!({"model_id": src, "gguf_type": "Q4_K_M"})),
            "gguf_type"
        );
        assert_eq!(
            field_of(json!({"model_id": src, "n_calibration": 0})),
            "n_calibration"
        );
        assert_eq!(
            field_of(json!({"model_id": src, "nonsense": 1})),
            "nonsense"
        );
        assert_eq!(
            field_of(json!({"model_id": src, "reference": "uniform_4bit"})),
            "reference"
        );
        assert_eq!(
            field_of(json!({"model_id": src, "calibration_mix": "x"})),
            "calibration_mix"
        );
        assert_eq!(field_of(json!({"model_id": "/no/such/model"})), "model_id");
        assert_eq!(field_of(json!({})), "model_id");
        assert_eq!(
            field_of(json!({"model_id": src, "out_dir": src})),
            "out_dir"
        );
        assert_eq!(
            field_of(json!({"model_id": src, "out_dir": "/proc/nope/x"})),
            "out_dir"
        );
    }

    #[test]
    fn defaults_and_names_follow_the_format() {
        let src = env!("CARGO_MANIFEST_DIR");
        let c = parse(json!({"model_id": src})).unwrap();
        assert_eq!(
            (c.format, c.uniform_gguf_type()),
            (OutputFormat::Gguf, GgmlType::Q4_K)
        );
        assert!(c.out.to_string_lossy().ends_with("Q4_K"));
        let c = parse(json!({"model_id": src, "format": "mlx", "target_bpw": 4.5})).unwrap();
        assert_eq!(c.name_suffix(), "mixed-4.5bpw");
        assert_eq!(c.candidates(), vec![2, 3, 4, 5, 6, 8]);
        let c = parse(json!({"model_id": src, "gguf_type": "q6_k", "candidate_bits": [8, 3, 3]}))
            .unwrap();
        assert_eq!(c.uniform_gguf_type(), GgmlType::Q6_K);
        assert_eq!(c.candidates(), vec![3, 8]);
    }
}
