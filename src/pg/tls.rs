//! How connections are opened: in plain text, or with TLS (feature `postgres-tls`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::config::SslMode;
use tokio_postgres::{AsyncMessage, Client, Config, Connection, NoTls};

use super::conn::Warnings;
use crate::error::Error;

/// A connection's driver: resolves when its session ends.
pub(super) type Driver = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

/// Drives `connection` until its session ends, counting in `heard` the warnings the server
/// sends (a `NoticeResponse` of severity `WARNING`). A notice is taken from the socket, and
/// counted here, before any reply that follows it is handed to the statement waiting for it:
/// a statement that sees no new warning once it has its reply got none.
async fn drive<S, T>(
    mut connection: Connection<S, T>,
    heard: Arc<Warnings>,
) -> Result<(), tokio_postgres::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
        if let AsyncMessage::Notice(notice) = message? {
            heard.note(&notice);
        }
    }
    Ok(())
}

/// What every connection of one `PgLease` is opened with.
#[derive(Clone)]
pub(super) enum Connector {
    /// No TLS: the connection string's `sslmode` must not require it.
    Plain,
    /// TLS with rustls, required for every connection.
    #[cfg(feature = "postgres-tls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl Connector {
    /// The connector for `tls` (what the builder was given) and the connection string's
    /// `config`, whose `sslmode` this may raise to `require`.
    #[cfg_attr(not(feature = "postgres-tls"), allow(unused_variables))]
    pub(super) fn choose(tls: Option<&PgTlsChoice>, config: &mut Config) -> Result<Self, Error> {
        #[cfg(feature = "postgres-tls")]
        {
            let tls = match tls {
                Some(PgTlsChoice(tls)) => tls.clone(),
                // `sslmode=require` without an explicit choice: the system's roots.
                None if config.get_ssl_mode() == SslMode::Require => PgTls::system_roots()?,
                None => return Ok(Connector::Plain),
            };
            // TLS was asked for: never fall back to plain text (`prefer` would).
            config.ssl_mode(SslMode::Require);
            Ok(Connector::Rustls(tls.connector))
        }
        #[cfg(not(feature = "postgres-tls"))]
        {
            if config.get_ssl_mode() == SslMode::Require {
                return Err(Error::TlsSetup {
                    detail: "the connection string asks for TLS (sslmode=require), but this \
                             build of flocklease has no TLS: enable its `postgres-tls` feature"
                        .to_owned(),
                });
            }
            Ok(Connector::Plain)
        }
    }

    /// Opens a connection with `config`; its driver counts the server's warnings in `heard`.
    pub(super) async fn connect(
        &self,
        config: &Config,
        heard: Arc<Warnings>,
    ) -> Result<(Client, Driver), tokio_postgres::Error> {
        match self {
            Connector::Plain => {
                let (client, connection) = config.connect(NoTls).await?;
                Ok((client, Box::pin(drive(connection, heard))))
            }
            #[cfg(feature = "postgres-tls")]
            Connector::Rustls(tls) => {
                let (client, connection) = config.connect(tls.clone()).await?;
                Ok((client, Box::pin(drive(connection, heard))))
            }
        }
    }
}

/// The builder's TLS choice (a private wrapper, so the builder's field exists in every build).
#[derive(Clone)]
pub(super) struct PgTlsChoice(#[cfg(feature = "postgres-tls")] pub(super) PgTls);

#[cfg(feature = "postgres-tls")]
pub use with_tls::PgTls;

#[cfg(feature = "postgres-tls")]
mod with_tls {
    use std::path::Path;
    use std::sync::Arc;

    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    use rustls::{ClientConfig, RootCertStore};
    use tokio_postgres_rustls::MakeRustlsConnect;

    use crate::error::Error;

    /// TLS for every connection of a [`PgLease`](super::super::PgLease) (feature
    /// `postgres-tls`), given to [`PgLeaseBuilder::tls`](super::super::PgLeaseBuilder::tls).
    ///
    /// The server's certificate is always verified: its chain against the chosen roots, and
    /// its name against the host of the connection string (a DNS name or an IP address in the
    /// certificate's subject alternative names) — what libpq calls `sslmode=verify-full`. A
    /// server that does not offer TLS is refused; nothing falls back to plain text.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use flocklease::pg::{PgLease, PgTls};
    ///
    /// # fn main() -> Result<(), flocklease::Error> {
    /// // A server whose certificate a private CA signed:
    /// let leases = PgLease::builder("host=db.internal user=jobs dbname=jobs")
    ///     .tls(PgTls::ca_file("/etc/ssl/private-ca.pem")?)
    ///     .connect()?;
    /// # Ok(())
    /// # }
    /// ```
    #[derive(Clone)]
    pub struct PgTls {
        pub(in crate::pg) connector: MakeRustlsConnect,
    }

    impl std::fmt::Debug for PgTls {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("PgTls").finish_non_exhaustive()
        }
    }

    impl PgTls {
        /// Trusts the system's root certificates (the platform's store; the `SSL_CERT_FILE`
        /// and `SSL_CERT_DIR` environment variables override it). Used when the connection
        /// string says `sslmode=require` and no [`PgTls`] is given.
        ///
        /// # Errors
        ///
        /// [`Error::TlsSetup`] when no usable root certificate is found.
        pub fn system_roots() -> Result<PgTls, Error> {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
                return Err(Error::TlsSetup {
                    detail: format!(
                        "no usable root certificate in the system's store{}; name the \
                         server's CA with PgTls::ca_file",
                        if why.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", why.join("; "))
                        }
                    ),
                });
            }
            Ok(PgTls::from_roots(roots))
        }

        /// Trusts only the CA certificates in the PEM file at `path` (what libpq's
        /// `sslrootcert` names): for servers whose certificate a private CA signed.
        ///
        /// # Errors
        ///
        /// [`Error::Io`] when the file cannot be read; [`Error::TlsSetup`] when it holds no
        /// usable certificate.
        pub fn ca_file(path: impl AsRef<Path>) -> Result<PgTls, Error> {
            let path = path.as_ref();
            let pem = std::fs::read(path).map_err(|e| Error::io("read", path, e))?;
            let mut roots = RootCertStore::empty();
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
                .filter_map(Result::ok)
                .collect();
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(Error::TlsSetup {
                    detail: format!(
                        "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----) usable as \
                         a root",
                        path.display()
                    ),
                });
            }
            Ok(PgTls::from_roots(roots))
        }

        /// Uses `config` as it is: client certificates, other roots, another verifier. Its
        /// crypto provider is the one the config was built with.
        pub fn from_rustls(config: ClientConfig) -> PgTls {
            PgTls {
                connector: MakeRustlsConnect::new(config),
            }
        }

        fn from_roots(roots: RootCertStore) -> PgTls {
            // An explicit provider: no dependence on a process-wide default, which is
            // ambiguous when the program links more than one.
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("the ring provider supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            PgTls::from_rustls(config)
        }
    }
}
