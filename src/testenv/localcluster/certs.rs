//! The cluster's PKI: a CA, the API server's serving certificate and the service-account signing key.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Names the API server answers to: loopback for us, the in-cluster names and the first
/// service IP for anything that runs "inside" (kube-controller-manager hands them to pods).
const SERVING_NAMES: &[&str] = &[
    "127.0.0.1",
    "localhost",
    "10.96.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// PEM-encoded keys and certificates, ready to be written to files.
pub(super) struct Pki {
    pub ca_cert: String,
    pub serving_cert: String,
    pub serving_key: String,
    pub service_account_key: String,
    pub service_account_public_key: String,
}

/// Fresh ECDSA P-256 keys: quick to generate, accepted by Go's TLS, rustls and the
/// service-account token signer (ES256).
pub(super) fn generate() -> Result<Pki, rcgen::Error> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "rewind local CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut serving_params = CertificateParams::new(
        SERVING_NAMES
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
    )?;
    serving_params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_key = KeyPair::generate()?;
    let serving_cert = serving_params.signed_by(&serving_key, &ca)?;

    let service_account = KeyPair::generate()?;
    Ok(Pki {
        ca_cert: ca.pem(),
        serving_cert: serving_cert.pem(),
        serving_key: serving_key.serialize_pem(),
        service_account_key: service_account.serialize_pem(),
        service_account_public_key: service_account.public_key_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_pem_files_the_components_can_parse() {
        let pki = generate().unwrap();
        assert!(pki.ca_cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.serving_cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.serving_key.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(
            pki.service_account_key
                .starts_with("-----BEGIN PRIVATE KEY-----")
        );
        assert!(
            pki.service_account_public_key
                .starts_with("-----BEGIN PUBLIC KEY-----")
        );
        assert_ne!(pki.serving_key, pki.service_account_key);
    }
}
