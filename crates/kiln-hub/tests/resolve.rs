//! Model resolution and listing over temp-dir layouts; no network.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use kiln_hub::{Hub, HubError, ModelKind, ResolvedModel};

/// A hub whose sources point at a closed port: any network use would fail.
fn offline_hub(root: &Path) -> Hub {
    let gguf = fake_gguf(2048);
    hub(root, "http://127.0.0.1:9", tiny_model(&gguf, b"unused"))
}

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, bytes).expect("write");
}

/// Lays out `models--org--name` with snapshots `revs`, each holding `files`.
fn hf_repo(root: &Path, repo: &str, main: Option<&str>, revs: &[&str], files: &[&str]) -> PathBuf {
    let dir = root
        .join("hf")
        .join(format!("models--{}", repo.replace('/', "--")));
    for rev in revs {
        for f in files {
            write(&dir.join("snapshots").join(rev).join(f), f.as_bytes());
        }
        // Distinct mtimes, so "newest" is well defined.
        std::thread::sleep(std::time::Duration::from_millis(15));
    }
    if let Some(main) = main {
        write(
            &dir.join("refs").join("main"),
            format!("{main}\n").as_bytes(),
        );
    }
    dir
}

#[test]
fn hf_repo_id_follows_refs_main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = hf_repo(
        dir.path(),
        "org/name",
        Some("aaa"),
        &["aaa", "bbb"],
        &["config.json"],
    );
    let hub = offline_hub(dir.path());
    assert_eq!(
        hub.resolve_model("org/name", false).expect("resolve"),
        ResolvedModel {
            path: repo.join("snapshots/aaa"),
            kind: ModelKind::HfFolder
        }
    );
    // An explicit revision picks its snapshot.
    assert_eq!(
        hub.resolve_model("org/name@bbb", false)
            .expect("resolve")
            .path,
        repo.join("snapshots/bbb")
    );
}

#[test]
fn hf_repo_without_refs_uses_the_newest_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = hf_repo(
        dir.path(),
        "org/name",
        None,
        &["old", "new"],
        &["config.json"],
    );
    let hub = offline_hub(dir.path());
    assert_eq!(
        hub.resolve_model("org/name", false).expect("resolve").path,
        repo.join("snapshots/new")
    );
}

#[test]
fn hf_gguf_repos_resolve_to_their_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = hf_repo(
        dir.path(),
        "org/one-gguf",
        Some("r1"),
        &["r1"],
        &["m.Q4_0.gguf"],
    );
    let multi = hf_repo(
        dir.path(),
        "org/two-gguf",
        Some("r1"),
        &["r1"],
        &["a.gguf", "b.gguf"],
    );
    let hub = offline_hub(dir.path());
    let one = hub.resolve_model("org/one-gguf", false).expect("resolve");
    assert_eq!(one.kind, ModelKind::GgufFile);
    assert_eq!(one.path, repo.join("snapshots/r1/m.Q4_0.gguf"));
    let named = hub
        .resolve_model("org/two-gguf/b.gguf", false)
        .expect("resolve");
    assert_eq!(named.path, multi.join("snapshots/r1/b.gguf"));
    let msg = hub
        .resolve_model("org/two-gguf", false)
        .expect_err("ambiguous")
        .to_string();
    assert!(msg.contains("a.gguf") && msg.contains("b.gguf"), "{msg}");
}

#[test]
fn local_paths_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hub = offline_hub(dir.path());
    let file = dir.path().join("x/model.gguf");
    write(&file, b"GGUF....");
    let r = hub
        .resolve_model(file.to_str().expect("utf8"), false)
        .expect("file");
    assert_eq!((r.path, r.kind), (file.clone(), ModelKind::GgufFile));

    // A folder holding one .gguf resolves to the file.
    let r = hub
        .resolve_model(dir.path().join("x").to_str().expect("utf8"), false)
        .expect("dir");
    assert_eq!(r.path, file);

    let folder = dir.path().join("hf-folder");
    write(&folder.join("config.json"), b"{}");
    write(&folder.join("model.safetensors"), b"");
    let r = hub
        .resolve_model(folder.to_str().expect("utf8"), false)
        .expect("folder");
    assert_eq!((r.path, r.kind), (folder, ModelKind::HfFolder));

    // No .gguf extension, but GGUF magic.
    let magic = dir.path().join("model.bin");
    write(&magic, b"GGUF\x03\0\0\0");
    assert_eq!(
        hub.resolve_model(magic.to_str().expect("utf8"), false)
            .expect("magic")
            .kind,
        ModelKind::GgufFile
    );

    let text = dir.path().join("notes.txt");
    write(&text, b"hello");
    let err = hub
        .resolve_model(text.to_str().expect("utf8"), false)
        .expect_err("not a model");
    assert!(matches!(err, HubError::InvalidSpec { .. }));
    assert!(err.to_string().contains("not a GGUF file"), "{err}");

    let empty = dir.path().join("empty");
    fs::create_dir_all(&empty).expect("mkdir");
    let msg = hub
        .resolve_model(empty.to_str().expect("utf8"), false)
        .expect_err("empty")
        .to_string();
    assert!(msg.contains("neither config.json nor a .gguf"), "{msg}");
}

#[test]
fn files_in_the_kiln_cache_resolve_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hub = offline_hub(dir.path());
    let file = hub.models_dir().join("mine.Q8_0.gguf");
    write(&file, b"GGUF");
    assert_eq!(
        hub.resolve_model("mine.Q8_0.gguf", false)
            .expect("name")
            .path,
        file
    );
    assert_eq!(
        hub.resolve_model("mine.Q8_0", false).expect("stem").path,
        file
    );
}

#[test]
fn starter_names_resolve_to_the_cached_file_without_network() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = fake_gguf(2048);
    let hub = hub(
        dir.path(),
        "http://127.0.0.1:9",
        tiny_model(&gguf, b"unused"),
    );
    let dest = hub.models_dir().join(GGUF_NAME);
    write(&dest, &gguf);
    for spec in ["", "  ", "default", "tiny", "TINY", GGUF_NAME] {
        let r = hub.resolve_model(spec, false).expect(spec);
        assert_eq!((&r.path, r.kind), (&dest, ModelKind::GgufFile), "{spec:?}");
    }
    assert!(kiln_hub::sidecar_path(&dest).is_file());
}

#[test]
fn unknown_specs_list_what_was_tried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hub = offline_hub(dir.path());
    let err = hub
        .resolve_model("nobody/nothing", false)
        .expect_err("unknown");
    assert!(matches!(err, HubError::NotFound { .. }));
    let msg = err.to_string();
    assert!(msg.contains("model 'nobody/nothing' not found"), "{msg}");
    assert!(
        msg.contains("local path nobody/nothing (does not exist)"),
        "{msg}"
    );
    assert!(msg.contains("models--nobody--nothing"), "{msg}");
    assert!(
        msg.contains("known model names: Tiny, tiny, default"),
        "{msg}"
    );

    let msg = hub
        .resolve_model("llama", false)
        .expect_err("unknown")
        .to_string();
    assert!(msg.contains("llama.gguf (not found)"), "{msg}");
}

#[test]
fn list_cached_covers_both_caches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hub = offline_hub(dir.path());
    let models = hub.models_dir();
    write(&models.join("a.gguf"), &[0u8; 10]);
    write(&models.join("b.gguf.part"), &[0u8; 3]);
    write(&models.join(".a.gguf.lock"), b"");
    write(&models.join("a.gguf.verified"), b"{}");
    hf_repo(
        dir.path(),
        "org/folder",
        Some("r"),
        &["r"],
        &["config.json", "model.safetensors"],
    );
    hf_repo(dir.path(), "org/quants", Some("r"), &["r"], &["q/m.gguf"]);
    write(&dir.path().join("hf/version.txt"), b"1");

    let listed = hub.list_cached();
    let summary: Vec<(&str, u64, ModelKind)> = listed
        .iter()
        .map(|m| (m.name.as_str(), m.size_bytes, m.kind))
        .collect();
    assert_eq!(
        summary,
        [
            ("a.gguf", 10, ModelKind::GgufFile),
            (
                "org/folder",
                ("config.json".len() + "model.safetensors".len()) as u64,
                ModelKind::HfFolder
            ),
            (
                "org/quants/q/m.gguf",
                "q/m.gguf".len() as u64,
                ModelKind::GgufFile
            ),
        ]
    );
}
