//! The library API: sandboxed imports, the component cache, and the engine's pure exports.

use std::sync::Arc;

use abridge::types::Role;
use abridge::{Abridge, ComponentSource, Runtime, SqliteStore};

#[test]
fn compiled_code_is_cached_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let first = Runtime::load(&ComponentSource::Embedded, Some(dir.path())).unwrap();
    assert!(!first.report().from_cache);
    let cached: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .collect();
    assert_eq!(cached.len(), 1);
    let name = cached[0].file_name().to_string_lossy().into_owned();
    assert!(
        name.starts_with("abridge-guest-48.0.8-") && name.ends_with(".cwasm"),
        "{name}"
    );
    let second = Runtime::load(&ComponentSource::Embedded, Some(dir.path())).unwrap();
    assert!(second.report().from_cache);
    // A corrupt cache file is replaced, not trusted.
    std::fs::write(cached[0].path(), b"garbage").unwrap();
    let third = Runtime::load(&ComponentSource::Embedded, Some(dir.path())).unwrap();
    assert!(!third.report().from_cache);
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
    let conv = [abridge::types::Message {
        role: Role::User,
        content: "hi".into(),
    }];
    let p = engine.build_prompt(&conv, None).await.unwrap();
    assert_eq!(p.messages.len(), 2);
    assert!(p.chatml.ends_with("<|im_start|>assistant\n"));
}
