//! Where tests find the starter model. One function, so it can later fetch the model instead.

use std::path::PathBuf;

/// The SmolLM2-135M-Instruct Q4_1 GGUF: `$KILN_TEST_MODEL`, else
/// `$KILN_CACHE_DIR/models/…`, else `~/.cache/kiln/models/…`.
pub(crate) fn test_model_path() -> PathBuf {
    const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
    if let Some(p) = std::env::var_os("KILN_TEST_MODEL") {
        return PathBuf::from(p);
    }
    let cache = match std::env::var_os("KILN_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache").join("kiln")
        }
    };
    let path = cache.join("models").join(FILE);
    assert!(
        path.exists(),
        "test model not found at {} (set KILN_TEST_MODEL)",
        path.display()
    );
    path
}

/// The SmolLM2 reference data: `shared/reference/smollm2` next to the repository (where every
/// checkout and CI run has it).
pub(crate) fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/reference/smollm2")
}
