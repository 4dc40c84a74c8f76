//! `[kafka.tls]` and `[kafka.sasl]`: how broker connections are secured. Everything is
//! checked at start (files readable, PEM parsable, key matching certificate, mechanism
//! known), so a typo is a start-up error naming the setting, never a connection failure
//! later. The password is held as a [`Secret`] from the moment it is read.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::ring as provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use serde::Deserialize;

use super::values::{invalid, ConfigError};
use crate::kafka::sasl::{Credentials, Mechanism, Secret};
use crate::kafka::{Security, TlsClient};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub enable: Option<bool>,
    /// PEM file of the CA certificates to trust; absent: the system's trust store.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for brokers that require mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// Name to check every broker's certificate against instead of the broker's host.
    pub server_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawSasl {
    pub mechanism: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub password_file: Option<PathBuf>,
}

impl std::fmt::Debug for RawSasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawSasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("password_file", &self.password_file)
            .finish()
    }
}

/// What `/server_info` may say about the security settings: never a secret.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecuritySummary {
    pub tls: bool,
    pub mutual_tls: bool,
}

/// Builds the connection security from the two sections.
pub fn security(
    tls: Option<RawTls>,
    sasl: Option<RawSasl>,
) -> Result<(Security, SecuritySummary), ConfigError> {
    let tls = tls.filter(|t| t.enable.unwrap_or(true));
    let mutual_tls = tls.as_ref().is_some_and(|t| t.cert_file.is_some());
    let tls = tls.map(tls_client).transpose()?;
    let sasl = sasl.map(credentials).transpose()?;
    let summary = SecuritySummary {
        tls: tls.is_some(),
        mutual_tls,
    };
    Ok((
        Security {
            tls,
            sasl: sasl.map(Arc::new),
        },
        summary,
    ))
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| invalid(key, format!("cannot read `{}`: {e}", path.display())))
}

fn certificates(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let pem = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(key, format!("`{}`: bad PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(invalid(
            key,
            format!("`{}` holds no PEM certificate", path.display()),
        ));
    }
    Ok(certs)
}

fn tls_client(raw: RawTls) -> Result<TlsClient, ConfigError> {
    // Settings that need no file first, so their errors do not depend on the trust store.
    let server_name = raw
        .server_name
        .map(|n| {
            ServerName::try_from(n.clone()).map_err(|e| {
                invalid(
                    "kafka.tls.server_name",
                    format!("`{n}` is not a DNS name or IP address: {e}"),
                )
            })
        })
        .transpose()?;
    match (&raw.cert_file, &raw.key_file) {
        (Some(_), None) => {
            return Err(invalid(
                "kafka.tls.key_file",
                "required with kafka.tls.cert_file",
            ))
        }
        (None, Some(_)) => {
            return Err(invalid(
                "kafka.tls.cert_file",
                "required with kafka.tls.key_file",
            ))
        }
        _ => {}
    }
    let mut roots = RootCertStore::empty();
    match &raw.ca_file {
        Some(path) => {
            for cert in certificates("kafka.tls.ca_file", path)? {
                roots.add(cert).map_err(|e| {
                    invalid(
                        "kafka.tls.ca_file",
                        format!("`{}`: unusable CA certificate: {e}", path.display()),
                    )
                })?;
            }
        }
        None => {
            // The system store, as the operator keeps it (update-ca-certificates). Files
            // that fail to load are skipped, as every TLS client on the host does.
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                log::warn!("system trust store: {e}");
            }
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(invalid(
                    "kafka.tls.ca_file",
                    "not set, and the system trust store has no usable certificate \
                     (install ca-certificates, or set kafka.tls.ca_file)",
                ));
            }
        }
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(provider::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("kafka.tls", e.to_string()))?
        .with_root_certificates(roots);
    let config = match (&raw.cert_file, &raw.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certificates("kafka.tls.cert_file", cert)?;
            let pem = read("kafka.tls.key_file", key)?;
            let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                invalid(
                    "kafka.tls.key_file",
                    format!("`{}`: no usable PEM private key: {e}", key.display()),
                )
            })?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                invalid(
                    "kafka.tls.key_file",
                    format!(
                        "`{}` does not go with kafka.tls.cert_file `{}`: {e}",
                        key.display(),
                        cert.display()
                    ),
                )
            })?
        }
        // Both or neither: checked above.
        _ => builder.with_no_client_auth(),
    };
    Ok(TlsClient {
        config: Arc::new(config),
        server_name,
    })
}

fn credentials(raw: RawSasl) -> Result<Credentials, ConfigError> {
    let RawSasl {
        mechanism,
        username,
        password,
        password_file,
    } = raw;
    let names = Mechanism::ALL.map(|m| m.name()).join(", ");
    let mechanism = mechanism
        .ok_or_else(|| invalid("kafka.sasl.mechanism", format!("required: one of {names}")))?;
    let mechanism = Mechanism::parse(&mechanism).ok_or_else(|| {
        invalid(
            "kafka.sasl.mechanism",
            format!("`{mechanism}` is not one of {names}"),
        )
    })?;
    let username = username
        .filter(|u| !u.is_empty())
        .ok_or_else(|| invalid("kafka.sasl.username", "required"))?;
    let password = match (password, password_file) {
        (Some(p), None) => p,
        (None, Some(path)) => {
            let bytes = read("kafka.sasl.password_file", &path)?;
            let mut p = String::from_utf8(bytes).map_err(|_| {
                invalid(
                    "kafka.sasl.password_file",
                    format!("`{}` is not UTF-8", path.display()),
                )
            })?;
            // One trailing newline is the editor's, not the password's.
            if p.ends_with('\n') {
                p.pop();
                if p.ends_with('\r') {
                    p.pop();
                }
            }
            p
        }
        (Some(_), Some(_)) => {
            return Err(invalid(
                "kafka.sasl.password",
                "set kafka.sasl.password or kafka.sasl.password_file, not both",
            ))
        }
        (None, None) => {
            return Err(invalid(
                "kafka.sasl.password",
                "required (or kafka.sasl.password_file)",
            ))
        }
    };
    if password.is_empty() {
        return Err(invalid("kafka.sasl.password", "must not be empty"));
    }
    Ok(Credentials {
        mechanism,
        username,
        password: Secret::new(password),
    })
}
