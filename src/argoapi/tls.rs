//! TLS for the listener, as Argo's server serves it: a certificate and key
//! from files (a Secret mounted by the chart, which can generate a
//! self-signed one as Argo's server does), rustls with ring. The handshake
//! itself is in `listener`, within its header timeout.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use tokio_rustls::rustls::ServerConfig;

/// A certificate chain and its key, PEM files (`tls.crt`, `tls.key` of a
/// `kubernetes.io/tls` Secret).
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why the certificate cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "reading {what} {path}: {source}; check --argo-api-tls-cert and --argo-api-tls-key (the chart mounts the Secret argoApi.tls.secretName)"
    )]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} holds no PEM {what} ({reason}); it must be a PEM file as a kubernetes.io/tls Secret carries"
    )]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("the certificate {cert} and key {key} do not make a TLS server: {source}")]
    Config {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: tokio_rustls::rustls::Error,
    },
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// The server configuration for `files`, offering HTTP/1.1 (what Argo's
/// HTTP clients speak to the REST API).
pub fn server_config(files: &CertFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let pem = |what, reason: String| TlsError::Pem {
        what,
        path: if what == "certificate" {
            files.cert.clone()
        } else {
            files.key.clone()
        },
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(&read(&files.cert, "certificate")?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem("certificate", e.to_string()))?;
    if chain.is_empty() {
        return Err(pem("certificate", "no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(&files.key, "key")?)
        .map_err(|e| pem("key", e.to_string()))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|source| TlsError::Config {
            cert: files.cert.clone(),
            key: files.key.clone(),
            source,
        })?;
    let mut config = config;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("rewind-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = CertFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        };
        let missing = server_config(&files).unwrap_err().to_string();
        assert!(
            missing.starts_with(&format!("reading certificate {}", files.cert.display())),
            "{missing}"
        );
        assert!(missing.contains("--argo-api-tls-cert"), "{missing}");
        std::fs::write(&files.cert, "not a certificate").unwrap();
        std::fs::write(&files.key, "not a key").unwrap();
        let bad = server_config(&files).unwrap_err().to_string();
        assert!(bad.contains("holds no PEM certificate"), "{bad}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
