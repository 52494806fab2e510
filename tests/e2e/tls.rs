//! Model servers over https: rustls with Mozilla's roots plus ABRIDGE_CA_CERT, against an
//! https front of the test server on loopback, with a test CA and a certificate for
//! 127.0.0.1 generated for each test (rcgen).

use abridge_test_llm::TlsFront;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

use crate::harness::*;

/// A new CA and a certificate for 127.0.0.1 and localhost signed by it.
struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Pki {
    fn generate() -> Pki {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "abridge test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        leaf.distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        let key = KeyPair::generate().unwrap();
        let cert_pem = leaf.signed_by(&key, &issuer).unwrap().pem();
        Pki {
            ca_pem,
            cert_pem,
            key_pem: key.serialize_pem(),
        }
    }

    fn front(&self, server: &TestServer) -> TlsFront {
        TlsFront::start(server, self.cert_pem.as_bytes(), self.key_pem.as_bytes()).unwrap()
    }

    /// The CA certificate written into the test's folder, for ABRIDGE_CA_CERT.
    fn ca_file(&self, env: &Env) -> String {
        env.write("test-ca.pem", &self.ca_pem).display().to_string()
    }
}

#[test]
fn ollama_and_openai_backends_speak_https() {
    let pki = Pki::generate();
    let server = TestServer::start();
    let tls = pki.front(&server);
    let env = Env::new();
    let ca = pki.ca_file(&env);
    let env = env
        .with("EXTRACTION_URL", &tls.url())
        .with("ABRIDGE_CA_CERT", &ca);
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
    let tls2 = pki.front(&plain);
    let env = Env::new();
    let ca = pki.ca_file(&env);
    let env = env
        .with("OPENAI_BASE_URL", &format!("{}/v1", tls2.url()))
        .with("OPENAI_API_KEY", "sk-test-secret")
        .with("ABRIDGE_CA_CERT", &ca);
    let r = env.run(&["summarize", &fixture("openai.json"), "--backend", "openai"]);
    r.assert_ok();
    assert!(!r.stderr.contains("clear text"), "{}", r.stderr);
    assert_eq!(plain.generations().len(), 1);
}

#[test]
fn an_untrusted_certificate_is_an_error_that_names_the_fix_never_a_fall_back() {
    let server = TestServer::start();
    let tls = Pki::generate().front(&server);
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
