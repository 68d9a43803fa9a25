//! Whether a model is an embedding model, and how it pools: sentence-transformers' folder
//! layout (`modules.json`, the Pooling module's `config.json`, a Normalize module) or GGUF's
//! `<arch>.pooling_type` (llama.cpp's numbering); the Dense modules that follow the pooling.

mod dense;

use std::path::Path;
use std::sync::Arc;

pub use dense::{Dense, apply_all, check_chain, dense_from_folder, dense_from_tensor};

use serde_json::Value;

use crate::ModelError;
use crate::files::read_json;
use crate::gguf::GgufHeader;

/// How the token states of one input become its embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every token's state.
    Mean,
    /// The first token's state.
    Cls,
    /// The last token's state (decoder embedders: Qwen3-Embedding).
    Last,
    /// A cross-encoder's relevance score of a (query, document) pair: the first token's
    /// state through the pooler and a one-label classifier (rerankers).
    Rank,
}

impl Pooling {
    /// The name used in listings.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::Last => "last",
            Self::Rank => "rank",
        }
    }
}

/// An embedding model's pooling, the Dense modules after it, and whether its embeddings are
/// L2-normalized.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingConfig {
    /// How token states are pooled.
    pub pooling: Pooling,
    /// Whether the model's own pipeline normalizes (sentence-transformers' Normalize module;
    /// GGUF files say nothing, and llama-server normalizes by default).
    pub normalize: bool,
    /// Projections applied to each pooled state, in order (none for most models).
    pub dense: Arc<[Dense]>,
}

impl EmbeddingConfig {
    /// Pooling `pooling`, normalized or not, with no Dense modules.
    pub fn new(pooling: Pooling, normalize: bool) -> Self {
        Self {
            pooling,
            normalize,
            dense: Arc::from(Vec::new()),
        }
    }

    /// Width of an embedding: the last Dense module's output, else the model's `hidden` size
    /// (1 for a reranker's score).
    pub fn width(&self, hidden: usize) -> usize {
        match (self.pooling, self.dense.last()) {
            (Pooling::Rank, _) => 1,
            (_, Some(d)) => d.out_features,
            (_, None) => hidden,
        }
    }
}

fn bad(path: &Path, field: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Config {
        path: path.into(),
        field: field.into(),
        reason: reason.into(),
    }
}

/// A sentence-transformers folder's pooling (`None`: no `modules.json`, not an embedding
/// model as far as the folder says).
pub fn embedding_from_hf(dir: &Path) -> Result<Option<EmbeddingConfig>, ModelError> {
    let modules_path = dir.join("modules.json");
    if !modules_path.is_file() {
        return Ok(None);
    }
    let modules = read_json(&modules_path)?;
    let list = modules
        .as_array()
        .ok_or_else(|| bad(&modules_path, "(root)", "must be a list of modules"))?;
    let kind = |m: &Value| {
        m.get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let Some(pooling_module) = list.iter().find(|m| kind(m).ends_with(".Pooling")) else {
        return Err(bad(
            &modules_path,
            "type",
            "no Pooling module (kiln pools as sentence-transformers' Pooling does)",
        ));
    };
    let sub = module_folder(&modules_path, pooling_module)?;
    let cfg_path = dir.join(sub).join("config.json");
    let pooling = pooling_of(&cfg_path, &read_json(&cfg_path)?)?;
    let normalize = list.iter().any(|m| kind(m).ends_with(".Normalize"));
    let dense = list
        .iter()
        .filter(|m| kind(m).ends_with(".Dense"))
        .map(|m| {
            let sub = module_folder(&modules_path, m)?;
            dense_from_folder(&dir.join(sub))
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(Some(EmbeddingConfig {
        pooling,
        normalize,
        dense: Arc::from(dense),
    }))
}

/// A module's folder inside the model (`path` in `modules.json`), refusing paths that leave it.
fn module_folder<'a>(modules_path: &Path, module: &'a Value) -> Result<&'a str, ModelError> {
    let sub = module
        .get("path")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(modules_path, "path", "a module has no path"))?;
    if sub.is_empty() || Path::new(sub).is_absolute() || sub.split(['/', '\\']).any(|p| p == "..") {
        return Err(bad(
            modules_path,
            "path",
            format!("{sub:?} is not a folder inside the model"),
        ));
    }
    Ok(sub)
}

/// The pooling a Pooling module's `config.json` names: `pooling_mode` (sentence-transformers
/// 5 and later) or the older `pooling_mode_*` flags.
pub fn pooling_of(path: &Path, cfg: &Value) -> Result<Pooling, ModelError> {
    let by_name = |name: &str| match name {
        "mean" | "mean_tokens" => Some(Pooling::Mean),
        "cls" | "cls_token" => Some(Pooling::Cls),
        "lasttoken" | "last" => Some(Pooling::Last),
        _ => None,
    };
    if let Some(mode) = cfg.get("pooling_mode").and_then(Value::as_str) {
        return by_name(mode).ok_or_else(|| {
            bad(
                path,
                "pooling_mode",
                format!("{mode:?} is not supported (mean, cls, lasttoken are)"),
            )
        });
    }
    let flag = |k: &str| cfg.get(k).and_then(Value::as_bool) == Some(true);
    let set: Vec<Pooling> = [
        ("pooling_mode_mean_tokens", Pooling::Mean),
        ("pooling_mode_cls_token", Pooling::Cls),
        ("pooling_mode_lasttoken", Pooling::Last),
    ]
    .into_iter()
    .filter(|(k, _)| flag(k))
    .map(|(_, p)| p)
    .collect();
    let others = [
        "pooling_mode_max_tokens",
        "pooling_mode_mean_sqrt_len_tokens",
        "pooling_mode_weightedmean_tokens",
    ];
    if let Some(k) = others.iter().find(|k| flag(k)) {
        return Err(bad(
            path,
            k,
            "this pooling is not supported (mean, cls, lasttoken are)",
        ));
    }
    match set.as_slice() {
        [one] => Ok(*one),
        [] => Err(bad(path, "pooling_mode", "no pooling mode is set")),
        _ => Err(bad(
            path,
            "pooling_mode",
            "several pooling modes are set; kiln pools one way",
        )),
    }
}

/// A GGUF's `<arch>.pooling_type` (llama.cpp: 1 mean, 2 cls, 3 last; 0 or absent: none).
pub fn embedding_from_gguf(
    path: &Path,
    header: &GgufHeader,
    arch: &str,
) -> Result<Option<EmbeddingConfig>, ModelError> {
    let key = format!("{arch}.pooling_type");
    let Some(v) = header.get(&key) else {
        return Ok(None);
    };
    let pooling = match v.as_u64() {
        Some(0) => return Ok(None),
        Some(1) => Pooling::Mean,
        Some(2) => Pooling::Cls,
        Some(3) => Pooling::Last,
        Some(4) => Pooling::Rank,
        Some(n) => {
            return Err(bad(
                path,
                &key,
                format!("pooling type {n} is not supported (1 mean, 2 cls, 3 last, 4 rank)"),
            ));
        }
        None => return Err(bad(path, &key, "must be an integer")),
    };
    Ok(Some(EmbeddingConfig::new(
        pooling,
        pooling != Pooling::Rank,
    )))
}

/// How a BERT GGUF without `bert.pooling_type` pools: a file with a classifier (`cls.output`)
/// is a reranker; any other is pooled by the mean, as sentence-transformers pools a BERT that
/// names no pooling.
pub fn bert_gguf_default(header: &GgufHeader) -> EmbeddingConfig {
    let pooling = if header.tensor("cls.output.weight").is_some() {
        Pooling::Rank
    } else {
        Pooling::Mean
    };
    EmbeddingConfig::new(pooling, pooling != Pooling::Rank)
}

/// A Hugging Face cross-encoder (`…ForSequenceClassification` in `config.json`'s
/// `architectures`): rank pooling, scores unnormalized.
pub fn reranker_from_hf(config: &Value) -> Option<EmbeddingConfig> {
    let classifier = config
        .get("architectures")
        .and_then(Value::as_array)
        .is_some_and(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .any(|s| s.ends_with("ForSequenceClassification"))
        });
    classifier.then(|| EmbeddingConfig::new(Pooling::Rank, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_both_pooling_config_forms() {
        let p = Path::new("1_Pooling/config.json");
        assert_eq!(
            pooling_of(p, &json!({"pooling_mode": "lasttoken"})).unwrap(),
            Pooling::Last
        );
        assert_eq!(
            pooling_of(
                p,
                &json!({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": false})
            )
            .unwrap(),
            Pooling::Mean
        );
        assert!(pooling_of(p, &json!({"pooling_mode": "max"})).is_err());
        assert!(pooling_of(p, &json!({"pooling_mode_max_tokens": true})).is_err());
        assert!(
            pooling_of(
                p,
                &json!({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true})
            )
            .is_err()
        );
        assert!(pooling_of(p, &json!({})).is_err());
    }

    fn gguf_with(
        meta: Vec<(String, crate::gguf::MetaValue)>,
    ) -> (tempfile::TempDir, crate::gguf::GgufFile) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        crate::gguf::GgufWriter::create(&path, &meta, vec![])
            .unwrap()
            .finish()
            .unwrap();
        let file = crate::gguf::GgufFile::open(&path).unwrap();
        (dir, file)
    }

    #[test]
    fn reads_gguf_pooling_type() {
        use crate::gguf::MetaValue;
        let p = Path::new("m.gguf");
        let at = |v: MetaValue| {
            let (_d, f) = gguf_with(vec![("qwen3.pooling_type".into(), v)]);
            embedding_from_gguf(p, f.header(), "qwen3")
        };
        let last = at(MetaValue::U32(3)).unwrap().unwrap();
        assert_eq!((last.pooling, last.normalize), (Pooling::Last, true));
        assert_eq!(
            at(MetaValue::U32(1)).unwrap().unwrap().pooling,
            Pooling::Mean
        );
        assert_eq!(
            at(MetaValue::U32(2)).unwrap().unwrap().pooling,
            Pooling::Cls
        );
        assert_eq!(at(MetaValue::U32(0)).unwrap(), None);
        assert!(at(MetaValue::U32(5)).is_err(), "no pooling type 5");
        assert_eq!(
            at(MetaValue::U32(4)).unwrap().unwrap().pooling,
            Pooling::Rank
        );
        assert!(at(MetaValue::String("last".into())).is_err());
        let (_d, f) = gguf_with(vec![]);
        assert_eq!(embedding_from_gguf(p, f.header(), "qwen3").unwrap(), None);
    }
}
