//! Opening a model from disk: a GGUF file or a Hugging Face folder, turned into a config, a
//! tensor source and the generation defaults the model ships with.

use std::path::{Path, PathBuf};

use crate::ModelError;
use crate::config::{ModelConfig, config_from_gguf, config_from_hf_json};
use crate::gguf::GgufFile;
use crate::mlx::MlxQuantization;
use crate::weights::{GgufSource, SafetensorsSource, TensorSource};

/// The on-disk format of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// One GGUF file.
    Gguf,
    /// A Hugging Face folder with `config.json` and safetensors.
    HfFolder,
}

/// Sampling defaults from `generation_config.json` (only the fields the spec says are read).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    /// Default temperature.
    pub temperature: Option<f32>,
    /// Default nucleus threshold.
    pub top_p: Option<f32>,
    /// Default top-k.
    pub top_k: Option<usize>,
    /// Default repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Extra end-of-sequence ids.
    pub eos_token_ids: Vec<u32>,
}

/// A model's files, opened and validated, before any weight is read.
pub struct ModelFiles {
    /// The file or folder.
    pub path: PathBuf,
    /// Its format.
    pub format: ModelFormat,
    /// The architecture description.
    pub config: ModelConfig,
    /// Where weights come from.
    pub source: WeightFiles,
    /// Defaults from `generation_config.json` (empty for GGUF).
    pub generation: GenerationDefaults,
    /// How an embedding model pools (`None`: a generative model).
    pub embedding: Option<crate::embedding::EmbeddingConfig>,
}

impl ModelFiles {
    /// Opens a `.gguf` file or a Hugging Face folder.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        if path.is_dir() {
            return Self::open_hf(path);
        }
        let gguf = GgufFile::open(path)?;
        let config = config_from_gguf(path, gguf.header())?;
        let arch_name = gguf
            .header()
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .unwrap_or(config.arch.name())
            .to_string();
        let embedding =
            match crate::embedding::embedding_from_gguf(path, gguf.header(), &arch_name)? {
                None if config.arch.is_encoder() => {
                    Some(crate::embedding::bert_gguf_default(gguf.header()))
                }
                e => e,
            };
        let source = GgufSource::new(gguf, config.arch, config.num_heads, config.num_kv_heads);
        let embedding = match embedding {
            Some(mut e) => {
                let dense = ["dense_2.weight", "dense_3.weight"]
                    .into_iter()
                    .filter_map(|n| crate::embedding::dense_from_tensor(&source, n).transpose())
                    .collect::<Result<Vec<_>, ModelError>>()?;
                crate::embedding::check_chain(path, &dense, config.hidden_size)?;
                e.dense = dense.into();
                Some(e)
            }
            None => None,
        };
        Ok(Self {
            path: path.into(),
            format: ModelFormat::Gguf,
            config,
            source: WeightFiles::Gguf(source),
            generation: GenerationDefaults::default(),
            embedding,
        })
    }

    fn open_hf(dir: &Path) -> Result<Self, ModelError> {
        let config_path = dir.join("config.json");
        let json = read_json(&config_path)?;
        let config = config_from_hf_json(&config_path, &json)?;
        let gen_path = dir.join("generation_config.json");
        let generation = if gen_path.is_file() {
            generation_defaults(&read_json(&gen_path)?)
        } else {
            GenerationDefaults::default()
        };
        // MLX-quantized folders run as they are; a non-MLX quantization_config fails here.
        let quantization = MlxQuantization::from_config(&config_path, &json)?;
        let source = SafetensorsSource::open_with_quantization(dir, quantization)?;
        let embedding = match crate::embedding::embedding_from_hf(dir)? {
            Some(e) => Some(e),
            None if config.arch.is_encoder() => crate::embedding::reranker_from_hf(&json),
            None => None,
        };
        if let Some(e) = &embedding {
            crate::embedding::check_chain(&dir.join("modules.json"), &e.dense, config.hidden_size)?;
        }
        Ok(Self {
            path: dir.into(),
            format: ModelFormat::HfFolder,
            config,
            source: WeightFiles::Safetensors(source),
            generation,
            embedding,
        })
    }

    /// The GGUF file, when the model is one.
    pub fn gguf(&self) -> Option<&GgufFile> {
        match &self.source {
            WeightFiles::Gguf(s) => Some(s.file()),
            WeightFiles::Safetensors(_) => None,
        }
    }

    /// The weights as a [`TensorSource`].
    pub fn tensors(&self) -> &dyn TensorSource {
        match &self.source {
            WeightFiles::Gguf(s) => s,
            WeightFiles::Safetensors(s) => s,
        }
    }
}

/// The weight files of a model, by format.
pub enum WeightFiles {
    /// A GGUF file.
    Gguf(GgufSource),
    /// Safetensors files of a Hugging Face folder.
    Safetensors(SafetensorsSource),
}

/// Reads and parses a JSON file, naming it in errors.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config {
        path: path.into(),
        field: "(json)".into(),
        reason: e.to_string(),
    })
}

fn generation_defaults(json: &serde_json::Value) -> GenerationDefaults {
    let f = |k: &str| json.get(k).and_then(|v| v.as_f64()).map(|v| v as f32);
    let eos = match json.get("eos_token_id") {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_u64())
            .filter_map(|v| u32::try_from(v).ok())
            .collect(),
        Some(v) => v
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .into_iter()
            .collect(),
        None => vec![],
    };
    GenerationDefaults {
        temperature: f("temperature"),
        top_p: f("top_p"),
        top_k: json
            .get("top_k")
            .and_then(|v| v.as_u64())
            .map(|v| v as usize),
        repetition_penalty: f("repetition_penalty"),
        eos_token_ids: eos,
    }
}
