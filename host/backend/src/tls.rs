//! HTTP clients for model servers, speaking https through rustls: the ring provider and
//! Mozilla's root certificates compiled in, plus the certificates in the PEM file named by
//! `ABRIDGE_CA_CERT` (a private CA, or a self-hosted server's own certificate). Nothing
//! depends on the machine's certificate store, which a fresh machine may not have.

use std::sync::Arc;

use crate::types::Error;

/// The environment variable naming extra trusted certificates (PEM).
pub const CA_CERT_ENV: &str = "ABRIDGE_CA_CERT";

/// A reqwest client builder with abridge's TLS configuration.
pub(crate) fn client_builder() -> Result<reqwest::ClientBuilder, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = std::env::var_os(CA_CERT_ENV) {
        let shown = std::path::Path::new(&path).display().to_string();
        let bad = |why: String| {
            Error::InvalidInput(format!(
                "{CA_CERT_ENV}={shown}: {why} — point it at a PEM file of CA certificates, or unset it"
            ))
        };
        let pem = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let mut added = 0;
        for cert in rustls_pki_types_certs(&pem).map_err(bad)? {
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
            added += 1;
        }
        if added == 0 {
            return Err(bad("it holds no certificate".into()));
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::InvalidInput(format!("TLS configuration: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(reqwest::Client::builder().tls_backend_preconfigured(config))
}

/// The certificates in a PEM file.
fn rustls_pki_types_certs(
    pem: &[u8],
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate file ({e})"))
}
