//! The adapter registry (spec §3.7): the LoRA adapters mounted on a served model, shared by the
//! HTTP side (mount, unmount, list, and resolving a request's `adapter` field) and the engine
//! (whose sequences hold the resolved [`AdapterStack`] to their end).
//!
//! Mounting reads and checks the whole folder against the served model before anything changes
//! (all or nothing). Unmounting only removes the name: a sequence that resolved the adapter
//! keeps its `Arc` and finishes with it, and the weights are freed with the last such sequence.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use kiln_model::config::ModelConfig;
use kiln_model::lora::{
    AdapterStack, LoraAdapter, NO_ADAPTER, STACK_SEPARATOR, ServedAdapter, check_adapter_id,
};

/// Why a registry operation was refused; every message names the adapter or field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// A bad id, folder, file or shape (HTTP 400).
    #[error("{0}")]
    Invalid(String),
    /// Mounting an id that is already mounted (HTTP 400).
    #[error("adapter {id} is already mounted (from {path}); unmount it first")]
    AlreadyMounted {
        /// The id.
        id: String,
        /// Where the mounted one came from.
        path: String,
    },
    /// An id that is not mounted (HTTP 404 on unmount, 400 in a request).
    #[error("adapter {0} not mounted")]
    NotMounted(String),
}

#[derive(Default)]
struct Mounted {
    by_id: BTreeMap<String, Arc<ServedAdapter>>,
    /// The stack a request without an `adapter` field runs with (ids; empty: the base).
    default: Vec<String>,
}

/// The mounted adapters of one served model.
pub struct AdapterRegistry {
    config: ModelConfig,
    mounted: RwLock<Mounted>,
}

impl std::fmt::Debug for AdapterRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.list().iter().map(|a| a.id().to_string()).collect();
        f.debug_struct("AdapterRegistry")
            .field("mounted", &ids)
            .field("default", &self.default_spec())
            .finish()
    }
}

impl AdapterRegistry {
    /// An empty registry for a model with `config` (every mount is checked against it).
    pub fn new(config: ModelConfig) -> Self {
        Self {
            config,
            mounted: RwLock::new(Mounted::default()),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Mounted> {
        self.mounted.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Mounted> {
        self.mounted.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the adapter folder `path`, checks every module against the served model, and
    /// mounts it as `id`. Nothing changes on error. The files are read without holding the
    /// registry, so requests keep resolving meanwhile.
    pub fn mount(&self, id: &str, path: &Path) -> Result<Arc<ServedAdapter>, AdapterError> {
        check_adapter_id(id).map_err(AdapterError::Invalid)?;
        self.refuse_mounted(id)?;
        if !path.is_dir() {
            return Err(AdapterError::Invalid(format!(
                "adapter {id}: {} is not a folder",
                path.display()
            )));
        }
        let adapter = ServedAdapter::load(id, path, &self.config).map_err(|e| {
            AdapterError::Invalid(format!("adapter {id} ({}): {e}", path.display()))
        })?;
        let adapter = Arc::new(adapter);
        let mut m = self.write();
        if let Some(old) = m.by_id.get(id) {
            return Err(already(id, old));
        }
        m.by_id.insert(id.to_string(), adapter.clone());
        drop(m);
        tracing::info!(
            adapter = id,
            path = %path.display(),
            modules = adapter.mounted_layers(),
            "adapter mounted"
        );
        Ok(adapter)
    }

    /// Reads the adapter folder `path` and checks it against the served model as a mount
    /// would, without laying it out or mounting it.
    pub fn inspect(&self, path: &Path) -> Result<LoraAdapter, AdapterError> {
        LoraAdapter::load(path)
            .and_then(|a| a.check_servable(&self.config).map(|()| a))
            .map_err(|e| AdapterError::Invalid(format!("{}: {e}", path.display())))
    }

    /// Mounts an adapter already read and checked (tests, tools that build one in memory).
    pub fn insert(&self, adapter: ServedAdapter) -> Result<Arc<ServedAdapter>, AdapterError> {
        if !adapter.fits(&self.config) {
            return Err(AdapterError::Invalid(format!(
                "adapter {} does not fit the served model",
                adapter.id()
            )));
        }
        let adapter = Arc::new(adapter);
        let mut m = self.write();
        if let Some(old) = m.by_id.get(adapter.id()) {
            return Err(already(adapter.id(), old));
        }
        m.by_id.insert(adapter.id().to_string(), adapter.clone());
        Ok(adapter)
    }

    fn refuse_mounted(&self, id: &str) -> Result<(), AdapterError> {
        match self.read().by_id.get(id) {
            Some(old) => Err(already(id, old)),
            None => Ok(()),
        }
    }

    /// Unmounts `id` and returns it. Sequences that resolved it keep running with it. When it
    /// was part of the default stack, the default becomes the base model.
    pub fn unmount(&self, id: &str) -> Result<Arc<ServedAdapter>, AdapterError> {
        let mut m = self.write();
        let adapter = m
            .by_id
            .remove(id)
            .ok_or_else(|| AdapterError::NotMounted(id.to_string()))?;
        if m.default.iter().any(|d| d == id) {
            tracing::warn!(
                adapter = id,
                "the default adapter was unmounted; requests without `adapter` now run the base model"
            );
            m.default.clear();
        }
        drop(m);
        tracing::info!(adapter = id, "adapter unmounted");
        Ok(adapter)
    }

    /// The mounted adapters, by id.
    pub fn list(&self) -> Vec<Arc<ServedAdapter>> {
        self.read().by_id.values().cloned().collect()
    }

    /// The mounted ids, sorted.
    pub fn ids(&self) -> Vec<String> {
        self.read().by_id.keys().cloned().collect()
    }

    /// The adapter mounted as `id`.
    pub fn get(&self, id: &str) -> Option<Arc<ServedAdapter>> {
        self.read().by_id.get(id).cloned()
    }

    /// A request's `adapter` field: `None` (absent) is the default stack, `"none"` the base
    /// model, a mounted id that adapter, `"a+b"` a stack whose deltas add in that order. An
    /// unknown id is [`AdapterError::NotMounted`], a malformed spec or a repeated id
    /// [`AdapterError::Invalid`]; `Ok(None)` runs the base model.
    pub fn resolve(&self, spec: Option<&str>) -> Result<Option<Arc<AdapterStack>>, AdapterError> {
        let m = self.read();
        let ids: Vec<&str> = match spec {
            None => m.default.iter().map(String::as_str).collect(),
            Some(s) => parse_spec(s)?,
        };
        if ids.is_empty() {
            return Ok(None);
        }
        let adapters = ids
            .iter()
            .map(|id| {
                m.by_id
                    .get(*id)
                    .cloned()
                    .ok_or_else(|| AdapterError::NotMounted(id.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Arc::new(AdapterStack::new(adapters))))
    }

    /// Sets the stack requests without an `adapter` field run with (`"none"`: the base);
    /// every id must be mounted.
    pub fn set_default(&self, spec: &str) -> Result<(), AdapterError> {
        let ids: Vec<String> = parse_spec(spec)?.into_iter().map(String::from).collect();
        let mut m = self.write();
        if let Some(id) = ids.iter().find(|id| !m.by_id.contains_key(id.as_str())) {
            return Err(AdapterError::NotMounted(id.clone()));
        }
        m.default = ids;
        Ok(())
    }

    /// The default stack as a request would name it (`"none"` for the base model).
    pub fn default_spec(&self) -> String {
        let m = self.read();
        if m.default.is_empty() {
            NO_ADAPTER.to_string()
        } else {
            m.default.join(&STACK_SEPARATOR.to_string())
        }
    }
}

fn already(id: &str, old: &ServedAdapter) -> AdapterError {
    AdapterError::AlreadyMounted {
        id: id.to_string(),
        path: old.path().display().to_string(),
    }
}

/// `"none"` → no ids; `"a+b"` → `[a, b]`, each a valid id, none twice.
fn parse_spec(spec: &str) -> Result<Vec<&str>, AdapterError> {
    if spec == NO_ADAPTER {
        return Ok(Vec::new());
    }
    if spec.is_empty() {
        return Err(AdapterError::Invalid(format!(
            "adapter must name a mounted adapter, several joined with '+', or {NO_ADAPTER:?}"
        )));
    }
    let ids: Vec<&str> = spec.split(STACK_SEPARATOR).collect();
    for (i, id) in ids.iter().enumerate() {
        if *id == NO_ADAPTER && ids.len() > 1 {
            return Err(AdapterError::Invalid(format!(
                "adapter {spec:?}: {NO_ADAPTER:?} cannot be stacked"
            )));
        }
        check_adapter_id(id)
            .map_err(|e| AdapterError::Invalid(format!("adapter {spec:?}: {e}")))?;
        if ids[..i].contains(id) {
            return Err(AdapterError::Invalid(format!(
                "adapter {spec:?} names {id} twice"
            )));
        }
    }
    Ok(ids)
}

/// Where a user-given adapter path points: `~/` is the home folder.
pub fn expand_path(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(path),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kiln_model::config::ModelConfig;
    use kiln_model::lora::{AdapterInfo, LoraAdapter, LoraWeights};

    use super::*;

    fn config() -> ModelConfig {
        let json = serde_json::json!({"architectures":["LlamaForCausalLM"],"model_type":"llama",
            "hidden_size":8, "intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":2,
            "num_key_value_heads":1,"vocab_size":32,"rms_norm_eps":1e-5,"rope_theta":10000.0,
            "max_position_embeddings":64,"tie_word_embeddings":true});
        kiln_model::config::config_from_hf_json(Path::new("config.json"), &json).expect("config")
    }

    fn adapter(cfg: &ModelConfig, in_features: usize) -> LoraAdapter {
        let mut modules = BTreeMap::new();
        modules.insert(
            "model.layers.1.self_attn.q_proj".to_string(),
            LoraWeights {
                in_features,
                out_features: cfg.q_width(),
                rank: 2,
                a: vec![0.1; in_features * 2],
                b: vec![0.2; 2 * cfg.q_width()],
                scale: 2.0,
            },
        );
        LoraAdapter {
            modules,
            base_model: None,
            info: AdapterInfo {
                rank: 2,
                scale: 2.0,
                ..AdapterInfo::default()
            },
        }
    }

    fn saved(cfg: &ModelConfig, name: &str, in_features: usize) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-adapters-{}-{name}", std::process::id()));
        adapter(cfg, in_features).save(&dir).expect("save");
        dir
    }

    #[test]
    fn mount_resolve_unmount() {
        let cfg = config();
        let reg = AdapterRegistry::new(cfg.clone());
        let good = saved(&cfg, "good", cfg.hidden_size);
        let a = reg.mount("a", &good).expect("mount a");
        assert_eq!((a.mounted_layers(), a.max_rank()), (1, 2));
        reg.mount("b", &good).expect("mount b");
        // Already mounted, whatever the folder.
        let err = reg.mount("a", &good).unwrap_err();
        assert!(matches!(err, AdapterError::AlreadyMounted { .. }), "{err}");
        assert!(
            err.to_string().contains("adapter a is already mounted"),
            "{err}"
        );
        // A shape mismatch is refused whole, naming the module.
        let bad = saved(&cfg, "bad", cfg.hidden_size + 1);
        let err = reg.mount("c", &bad).unwrap_err().to_string();
        assert!(
            err.contains("model.layers.1.self_attn.q_proj") && err.contains("in=9"),
            "{err}"
        );
        assert!(reg.get("c").is_none());
        let err = reg
            .mount("d", Path::new("/nonexistent/kiln"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a folder"), "{err}");
        for bad_id in ["", "none", "a+b", "a b", "x/y"] {
            assert!(
                matches!(reg.mount(bad_id, &good), Err(AdapterError::Invalid(_))),
                "{bad_id:?}"
            );
        }

        assert_eq!(reg.resolve(Some("none")).unwrap(), None);
        assert_eq!(reg.resolve(None).unwrap(), None);
        let s = reg.resolve(Some("a+b")).unwrap().unwrap();
        assert_eq!((s.key(), s.adapters().len()), ("a+b", 2));
        assert!(s.namespace().starts_with("a#") && s.namespace().contains("+b#"));
        let err = reg.resolve(Some("a+zz")).unwrap_err();
        assert_eq!(err, AdapterError::NotMounted("zz".into()));
        for bad in ["", "a+a", "a+none", "a+"] {
            assert!(reg.resolve(Some(bad)).is_err(), "{bad:?}");
        }

        reg.set_default("b").unwrap();
        assert_eq!(reg.resolve(None).unwrap().unwrap().key(), "b");
        assert_eq!(reg.default_spec(), "b");
        assert!(matches!(
            reg.set_default("zz"),
            Err(AdapterError::NotMounted(_))
        ));

        // A resolved stack outlives the unmount; the default falls back to the base.
        let held = reg.resolve(Some("b")).unwrap().unwrap();
        let gone = reg.unmount("b").unwrap();
        assert!(Arc::ptr_eq(&gone, &held.adapters()[0]));
        assert_eq!(reg.default_spec(), "none");
        assert_eq!(reg.resolve(None).unwrap(), None);
        assert_eq!(
            reg.unmount("b").unwrap_err().to_string(),
            "adapter b not mounted"
        );
        // Mounted again from the same folder: another namespace.
        let again = reg.mount("b", &good).unwrap();
        let s2 = reg.resolve(Some("b")).unwrap().unwrap();
        assert!(Arc::ptr_eq(&again, &s2.adapters()[0]));
        assert_ne!(held.namespace(), s2.namespace());
        assert_eq!(reg.list().len(), 2);
        for d in [good, bad] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
