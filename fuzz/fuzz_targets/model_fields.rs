//! A request's model-management fields on hostile input: `keep_alive` (as a string and as
//! JSON) and the path check on `model`. Parsing gives a value or a `BadKeepAlive`, never a
//! panic; a name with a `..` component, a leading `/` or a backslash is always path-shaped.

#![no_main]

use kiln_server::models::KeepAlive;
use kiln_server::models::pool::is_path_shaped;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(KeepAlive::For(d)) = KeepAlive::parse(&text) {
        // Finite keep-alives are at most a century.
        assert!(d.as_secs() <= 100 * 365 * 86_400 + 1);
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = KeepAlive::from_field(Some(&v));
    }
    let shaped = is_path_shaped(&text);
    if text.split('/').any(|p| p == "..") || text.starts_with('/') || text.contains('\\') {
        assert!(shaped, "{text:?} names a path");
    }
});
