//! TLS for `PgLease` (feature `postgres-tls`) against this binary's throwaway server, switched
//! to TLS with a certificate of a throwaway CA: every connection is encrypted, the server's
//! certificate and name are verified, and nothing falls back to plain text.

#![cfg(feature = "postgres-tls")]
#![allow(clippy::unwrap_used)]

#[path = "support/pg.rs"]
mod pg;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use flocklease::pg::{PgLease, PgTls};
use flocklease::{Error, Owner, SessionId, SessionLease};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// The tests switch the server's TLS on and off: one at a time.
static SERVER_MODE: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    SERVER_MODE.lock().unwrap_or_else(|e| e.into_inner())
}

struct Certs {
    /// The CA that signed the server's certificate.
    ca: PathBuf,
    /// A CA that signed nothing the server has.
    stranger: PathBuf,
    /// A CA-signed certificate for another name only (no loopback address in it).
    wrong_name: (PathBuf, PathBuf),
    /// The server's certificate and key (names `localhost` and `127.0.0.1`).
    server: (PathBuf, PathBuf),
}

fn new_ca(name: &str) -> (CertificateParams, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    (params, key)
}

/// Writes `pem` to `path`, readable by the server (it runs as `postgres` when we are root).
fn write_for_server(path: &Path, pem: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, pem).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    if nix::unistd::geteuid().is_root() {
        let user = nix::unistd::User::from_name("postgres").unwrap().unwrap();
        nix::unistd::chown(path, Some(user.uid), Some(user.gid)).unwrap();
    }
}

fn certs(server: &pg::PgServer) -> &'static Certs {
    static CERTS: OnceLock<Certs> = OnceLock::new();
    CERTS.get_or_init(|| {
        let dir = &server.dir;
        let (ca_params, ca_key) = new_ca("flocklease test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let issue = |names: Vec<String>, stem: &str| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            let (crt, pem) = (
                dir.join(format!("{stem}.crt")),
                dir.join(format!("{stem}.key")),
            );
            write_for_server(&crt, &cert.pem(), 0o644);
            write_for_server(&pem, &key.serialize_pem(), 0o600);
            (crt, pem)
        };
        let server_pair = issue(vec!["localhost".into(), "127.0.0.1".into()], "server");
        let wrong_name = issue(vec!["db.example.invalid".into()], "wrong-name");
        let ca = dir.join("ca.pem");
        write_for_server(&ca, &ca_cert.pem(), 0o644);
        let (s_params, s_key) = new_ca("a stranger CA");
        let stranger = dir.join("stranger.pem");
        write_for_server(
            &stranger,
            &s_params.self_signed(&s_key).unwrap().pem(),
            0o644,
        );
        Certs {
            ca,
            stranger,
            wrong_name,
            server: server_pair,
        }
    })
}

/// Switches the server's TLS on with `pair` (certificate, key), or off; waits until a new
/// connection sees the change (a reload is asynchronous).
fn set_server_tls(admin: &pg::Admin, url: &str, pair: Option<&(PathBuf, PathBuf)>) {
    match pair {
        Some((crt, key)) => {
            admin.execute(
                &format!("ALTER SYSTEM SET ssl_cert_file = '{}'", crt.display()),
                &[],
            );
            admin.execute(
                &format!("ALTER SYSTEM SET ssl_key_file = '{}'", key.display()),
                &[],
            );
            admin.execute("ALTER SYSTEM SET ssl = on", &[]);
        }
        None => {
            admin.execute("ALTER SYSTEM SET ssl = off", &[]);
        }
    }
    admin.query("SELECT pg_reload_conf()", &[]);
    let want = if pair.is_some() { "on" } else { "off" };
    let cert = pair.map(|(crt, _)| crt.display().to_string());
    let start = Instant::now();
    loop {
        let fresh = pg::Admin::connect(url);
        let ssl: String = fresh.query("SHOW ssl", &[])[0].get(0);
        let file: String = fresh.query("SHOW ssl_cert_file", &[])[0].get(0);
        if ssl == want && cert.as_ref().is_none_or(|c| *c == file) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the server did not reload its TLS settings"
        );
        std::thread::yield_now();
    }
}

fn setup() -> Option<(MutexGuard<'static, ()>, String, pg::Admin, &'static Certs)> {
    let guard = one_at_a_time();
    let server = pg::server()?;
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    let certs = certs(server);
    Some((guard, url, admin, certs))
}

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

#[cfg(feature = "cli")]
#[test]
fn the_command_runs_a_job_over_tls_and_refuses_an_unknown_ca() {
    let Some((_g, url, admin, certs)) = setup() else {
        return;
    };
    set_server_tls(&admin, &url, Some(&certs.server));
    let run = |ca: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_flocklease"))
            .args(["run", "--pg", &url, "--pg-ca"])
            .arg(ca)
            .args([
                "--id",
                "tls-cli",
                "--",
                "sh",
                "-c",
                "echo token=$FLOCKLEASE_TOKEN",
            ])
            .output()
            .unwrap()
    };
    let ok = run(&certs.ca);
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{ok:?}");
    assert!(out.starts_with("token="), "{out}");
    let refused = run(&certs.stranger);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(70), "{refused:?}");
    assert!(err.contains("certificate"), "{err}");
    // `status --pg` takes the same option.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_flocklease"))
        .args(["status", "--pg", &url, "--pg-ca"])
        .arg(&certs.ca)
        .args(["--id", "tls-cli"])
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(1), "{status:?}");
}
