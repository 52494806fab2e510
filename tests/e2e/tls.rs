//! Model servers over https: rustls with Mozilla's roots plus ABRIDGE_CA_CERT, against an
//! https front of the test server on loopback (a certificate for 127.0.0.1 from a test CA in
//! tests/fixtures/tls).

use abridge_test_llm::TlsFront;

use crate::harness::*;

fn front(server: &TestServer) -> TlsFront {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tls");
    let cert = std::fs::read(dir.join("server.pem")).unwrap();
    let key = std::fs::read(dir.join("server.key")).unwrap();
    TlsFront::start(server, &cert, &key).unwrap()
}

fn test_ca() -> String {
    fixture("tls/ca.pem")
}

#[test]
fn ollama_and_openai_backends_speak_https() {
    let server = TestServer::start();
    let tls = front(&server);
    let env = Env::new()
        .with("EXTRACTION_URL", &tls.url())
        .with("ABRIDGE_CA_CERT", &test_ca());
    // auto with an https URL tries it (no silent fall-back to the extractive engine).
    for backend in ["ollama", "auto"] {
        let r = env.run(&[
            "summarize",
            &fixture("chat.jsonl"),
            "--backend",
            backend,
            "--json",
        ]);
        r.assert_ok();
        assert_eq!(r.json()["backend"], "ollama", "{backend}: {}", r.stderr);
    }
    let asked = server.generations().len();
    assert!(asked >= 1, "no request reached the server");

    // The OpenAI-compatible backend with a key: over https, no clear-text warning.
    let plain = TestServer::start_with(abridge_test_llm::Options {
        ollama_api: false,
        ..Default::default()
    });
    let tls2 = front(&plain);
    let env = Env::new()
        .with("OPENAI_BASE_URL", &format!("{}/v1", tls2.url()))
        .with("OPENAI_API_KEY", "sk-test-secret")
        .with("ABRIDGE_CA_CERT", &test_ca());
    let r = env.run(&["summarize", &fixture("openai.json"), "--backend", "openai"]);
    r.assert_ok();
    assert!(!r.stderr.contains("clear text"), "{}", r.stderr);
    assert_eq!(plain.generations().len(), 1);
}

#[test]
fn an_untrusted_certificate_is_an_error_that_names_the_fix_never_a_fall_back() {
    let server = TestServer::start();
    let tls = front(&server);
    let env = Env::new()
        .with("EXTRACTION_URL", &tls.url())
        .with("ABRIDGE_RETRIES", "1");
    for backend in ["ollama", "auto"] {
        env.run(&["summarize", &fixture("chat.jsonl"), "--backend", backend])
            .assert_fails(3, &["TLS", "ABRIDGE_CA_CERT"]);
    }
    assert!(server.generations().is_empty());
    // A CA file that is not one is refused before anything runs.
    let bad = env.write("not-a-cert.pem", "hello");
    let env = env.with("ABRIDGE_CA_CERT", &bad.display().to_string());
    env.run(&["summarize", &fixture("chat.jsonl"), "--backend", "ollama"])
        .assert_fails(2, &["ABRIDGE_CA_CERT", "no certificate"]);
}
