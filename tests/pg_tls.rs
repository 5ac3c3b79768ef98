//! TLS for `PgLease` (feature `postgres-tls`) against this binary's throwaway server, switched
//! to TLS with a certificate of a throwaway CA: every connection is encrypted, the server's
//! certificate and name are verified, and nothing falls back to plain text.

#![cfg(feature = "postgres-tls")]
#![allow(clippy::unwrap_used)]

#[path = "support/pg.rs"]
mod pg;
#[path = "support/tls.rs"]
mod tls;

use std::fs;

use flocklease::pg::{PgLease, PgTls};
use flocklease::{Error, Owner, SessionId};

use tls::{set_server_tls, setup};

#[test]
fn every_connection_is_encrypted_and_the_lease_works() {
    let Some((_g, url, admin, certs)) = setup() else {
        return;
    };
    set_server_tls(&admin, &url, Some(&certs.server));
    let leases = PgLease::builder(&url)
        .tls(PgTls::ca_file(&certs.ca).unwrap())
        .connect()
        .unwrap();
    let id = SessionId::new("tls").unwrap();
    let lease = leases
        .acquire(&id, &Owner::new("a").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    // The transition and the liveness connections, seen from the server: all TLS.
    let rows = admin.query(
        "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s \
         USING (pid) WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()",
        &[],
    );
    let seen: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert!(
        seen.iter().any(|(app, _)| app == "flocklease-liveness"),
        "{seen:?}"
    );
    assert!(seen.iter().any(|(app, _)| app == "flocklease"), "{seen:?}");
    assert!(
        seen.iter().all(|(_, ssl)| *ssl),
        "plain-text sessions: {seen:?}"
    );
    // A second instance over TLS is refused while the first holds, and gets it after.
    let other = PgLease::builder(&url)
        .tls(PgTls::ca_file(&certs.ca).unwrap())
        .connect()
        .unwrap();
    assert!(
        other
            .acquire(&id, &Owner::new("b").unwrap())
            .unwrap()
            .is_held()
    );
    leases.release(&lease).unwrap();
    let next = other
        .acquire(&id, &Owner::new("b").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(next.token, lease.token + 1);
}

/// The error of a connect that must fail, as text with its sources.
fn refusal(result: Result<PgLease, Error>) -> String {
    let err = result.expect_err("the connection must be refused");
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    assert!(
        matches!(err, Error::Database { .. }),
        "not a database error: {text}"
    );
    text
}

#[test]
fn a_certificate_from_another_ca_or_for_another_name_is_refused() {
    let Some((_g, url, admin, certs)) = setup() else {
        return;
    };
    set_server_tls(&admin, &url, Some(&certs.server));
    let text = refusal(
        PgLease::builder(&url)
            .tls(PgTls::ca_file(&certs.stranger).unwrap())
            .connect(),
    );
    assert!(text.contains("certificate"), "{text}");
    // The right CA, but the certificate names another host than 127.0.0.1.
    set_server_tls(&admin, &url, Some(&certs.wrong_name));
    let text = refusal(
        PgLease::builder(&url)
            .tls(PgTls::ca_file(&certs.ca).unwrap())
            .connect(),
    );
    assert!(text.contains("certificate"), "{text}");
    set_server_tls(&admin, &url, Some(&certs.server));
}

#[test]
fn a_server_without_tls_is_refused_not_used_in_plain_text() {
    let Some((_g, url, admin, certs)) = setup() else {
        return;
    };
    set_server_tls(&admin, &url, None);
    refusal(
        PgLease::builder(&url)
            .tls(PgTls::ca_file(&certs.ca).unwrap())
            .connect(),
    );
    // `sslmode=require` in the connection string, with the CA named: refused likewise.
    refusal(
        PgLease::builder(&format!("{url} sslmode=require"))
            .tls(PgTls::ca_file(&certs.ca).unwrap())
            .connect(),
    );
    set_server_tls(&admin, &url, Some(&certs.server));
}

#[test]
fn sslmode_require_alone_verifies_against_the_system_roots() {
    let Some((_g, url, admin, certs)) = setup() else {
        return;
    };
    set_server_tls(&admin, &url, Some(&certs.server));
    // The throwaway CA is in no system store: the certificate cannot be verified. (Were
    // `require` taken as libpq takes it — encrypt, verify nothing — this would connect.)
    match PgLease::connect(&format!("{url} sslmode=require")) {
        // A machine without a system store says so.
        Err(Error::TlsSetup { .. }) => {}
        other => {
            let text = refusal(other);
            assert!(text.contains("certificate"), "{text}");
        }
    }
    // Plain `sslmode=prefer` (the default) without a TLS choice stays plain text.
    let plain = PgLease::connect(&url).unwrap();
    drop(plain);
}

#[test]
fn a_ca_file_without_certificates_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    fs::write(&empty, "not a certificate\n").unwrap();
    match PgTls::ca_file(&empty) {
        Err(Error::TlsSetup { detail }) => assert!(detail.contains("empty.pem"), "{detail}"),
        other => panic!("{other:?}"),
    }
    match PgTls::ca_file(dir.path().join("missing.pem")) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("missing.pem"), "{e}"),
        other => panic!("{other:?}"),
    }
}
