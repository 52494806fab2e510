//! Embedding backends against the test server's `/api/embed` and `/v1/embeddings`: batching,
//! answers checked and in order, an over-long input named (never dropped), transient faults
//! retried, a missing model reported.

use std::time::Duration;

use abridge_backend::RetryPolicy;
use abridge_backend::embedding::{EmbedApi, Embedder, ServerEmbedder};
use abridge_engine::types::Error;
use abridge_test_llm::{EMBED_DIM, Options, embed};

use crate::harness::*;

fn texts(n: usize) -> Vec<String> {
    (1..=n)
        .map(|i| format!("memory {i}: the deploy runs on Friday {i}"))
        .collect()
}

/// An Ollama embedder for the test server's model.
fn ollama(server: &TestServer) -> ServerEmbedder {
    let model = Options::default().models[0].clone();
    ServerEmbedder::new(
        EmbedApi::Ollama,
        &server.url(),
        None,
        &model,
        Duration::from_secs(30),
    )
    .unwrap()
}

fn quick() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        base: Duration::from_millis(10),
        max: Duration::from_millis(50),
    }
}

#[tokio::test]
async fn ollama_embeddings_come_in_batches_in_order_and_checked() {
    let server = TestServer::start();
    let model = Options::default().models[0].clone();
    let e = ollama(&server).with_batch(64);
    let input = texts(130);
    let v = e.embed(&input).await.unwrap();
    assert_eq!((v.dim, v.vectors.len()), (EMBED_DIM, 130));
    assert_eq!(v.model, format!("ollama:{model}"));
    for (t, got) in input.iter().zip(&v.vectors) {
        assert_eq!(got, &embed(t));
    }
    assert!(v.tokens.unwrap() > 0);
    let asked: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/embed")
        .collect();
    assert_eq!(asked.len(), 3, "130 texts in batches of 64");
    assert_eq!(asked[0].body["truncate"], false);
    assert!(asked[0].body["options"]["num_ctx"].as_u64().is_some());
    // Nothing to embed: no call.
    assert!(e.embed(&[]).await.unwrap().vectors.is_empty());
    assert_eq!(
        server
            .requests()
            .iter()
            .filter(|r| r.path == "/api/embed")
            .count(),
        3
    );
}

#[tokio::test]
async fn an_overlong_input_is_named_and_faults_are_retried() {
    let server = TestServer::start();
    let e = ollama(&server).with_num_ctx(64).with_retry(quick());
    let mut input = texts(8);
    input[4] = "word ".repeat(500);
    match e.embed(&input).await {
        Err(Error::ContextOverflow(m)) => assert!(m.contains("input 5 of 8"), "{m}"),
        other => panic!("expected the long input to be refused: {other:?}"),
    }
    // A server error then success: retried, the answer complete.
    server.push_faults([Fault::Status {
        code: 503,
        message: "busy".into(),
    }]);
    let v = e.embed(&texts(3)).await.unwrap();
    assert_eq!(v.vectors.len(), 3);
    // A model that is not there says how to get it.
    let missing = ServerEmbedder::new(
        EmbedApi::Ollama,
        &server.url(),
        None,
        "no-such-embedder",
        Duration::from_secs(30),
    )
    .unwrap();
    match missing.embed(&texts(1)).await {
        Err(Error::ModelNotFound(m)) => assert!(m.contains("ollama pull no-such-embedder"), "{m}"),
        other => panic!("expected model not found: {other:?}"),
    }
}

#[tokio::test]
async fn openai_compatible_embeddings_with_a_key() {
    let server = TestServer::start();
    let model = Options::default().models[0].clone();
    let e = ServerEmbedder::new(
        EmbedApi::OpenAi,
        &format!("{}/v1", server.url()),
        Some("sk-test-secret".into()),
        &model,
        Duration::from_secs(30),
    )
    .unwrap()
    .with_batch(2);
    let input = texts(5);
    let v = e.embed(&input).await.unwrap();
    assert_eq!(v.model, format!("openai:{model}"));
    assert_eq!(v.vectors[4], embed(&input[4]));
    assert_eq!(
        server
            .requests()
            .iter()
            .filter(|r| r.path == "/v1/embeddings")
            .count(),
        3
    );
}
