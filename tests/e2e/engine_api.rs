//! The library API: sandboxed imports, the component cache, and the engine's pure exports.

use std::sync::Arc;

use abridge_engine::types::Role;
use abridge_engine::{Abridge, ComponentSource, Runtime};
use abridge_store::SqliteStore;

#[test]
fn compiled_code_is_cached_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let first = Runtime::load(&ComponentSource::Embedded, Some(dir.path())).unwrap();
    assert!(!first.report().from_cache);
    let entries = || {
        let mut v: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        v.sort();
        v
    };
    let cached = entries();
    assert_eq!(cached.len(), 2, "{cached:?}");
    let (art, sum) = (&cached[0], &cached[1]);
    let name = art.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("abridge-guest-48.0.8-") && name.ends_with(".cwasm"),
        "{name}"
    );
    assert_eq!(sum.file_name().unwrap().to_string_lossy(), name + ".sha256");
    let second = Runtime::load(&ComponentSource::Embedded, Some(dir.path())).unwrap();
    assert!(second.report().from_cache);
    let good = std::fs::read(art).unwrap();
    assert!(good.len() > 1000);

    // Garbage, a single flipped bit in the middle (compiled code), and an overwritten run of
    // bytes of the same length: wasmtime's own header check catches only the first, so each
    // must be caught by the recorded hash and recompiled, never loaded.
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x01;
    let mut overwritten = good.clone();
    let mid = good.len() / 3;
    overwritten[mid..mid + 64].fill(0xCC); // int3 over whatever code was there
    for (what, bytes) in [
        ("garbage", b"garbage".to_vec()),
        ("one flipped bit", flipped),
        ("an overwritten run", overwritten),
    ] {
        std::fs::write(art, &bytes).unwrap();
        let again = Runtime::load(&ComponentSource::Embedded, Some(dir.path())).unwrap();
        assert!(
            !again.report().from_cache,
            "{what} was loaded from the cache"
        );
        assert_ne!(
            std::fs::read(art).unwrap(),
            bytes,
            "{what}: entry not rewritten"
        );
        // And the recompiled engine works.
        let rt = Runtime::load(&ComponentSource::Embedded, Some(dir.path())).unwrap();
        assert!(rt.report().from_cache);
    }
    // A missing hash file is not trusted either.
    std::fs::remove_file(sum).unwrap();
    let again = Runtime::load(&ComponentSource::Embedded, Some(dir.path())).unwrap();
    assert!(!again.report().from_cache);
    assert!(sum.exists());
}

#[tokio::test]
async fn pure_text_exports() {
    let engine = Abridge::builder()
        .store(Arc::new(SqliteStore::in_memory().unwrap()))
        .cache_dir(None)
        .build()
        .unwrap();
    assert_eq!(engine.estimate_tokens("Hello, world!").await.unwrap(), 6);
    let cleaned = engine
        .strip_template_tokens("<think>hm</think>Summary: The user left.<|im_end|>")
        .await
        .unwrap();
    assert_eq!(cleaned, "The user left.");
    let conv = [abridge_engine::types::Message {
        role: Role::User,
        content: "hi".into(),
    }];
    let p = engine.build_prompt(&conv, None).await.unwrap();
    assert_eq!(p.messages.len(), 2);
    assert!(p.chatml.ends_with("<|im_start|>assistant\n"));
}
