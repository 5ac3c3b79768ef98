//! A throwaway CA and certificates for the PostgreSQL TLS tests, and switching the tests'
//! throwaway server to TLS and back (shared by the library's and the command line's tests).

#![allow(dead_code, clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

use crate::pg;

/// The tests switch the server's TLS on and off: one at a time.
pub static SERVER_MODE: Mutex<()> = Mutex::new(());

pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    SERVER_MODE.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct Certs {
    /// The CA that signed the server's certificate.
    pub ca: PathBuf,
    /// A CA that signed nothing the server has.
    pub stranger: PathBuf,
    /// A CA-signed certificate for another name only (no loopback address in it).
    pub wrong_name: (PathBuf, PathBuf),
    /// The server's certificate and key (names `localhost` and `127.0.0.1`).
    pub server: (PathBuf, PathBuf),
}

pub fn new_ca(name: &str) -> (CertificateParams, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    (params, key)
}

/// Writes `pem` to `path`, readable by the server (it runs as `postgres` when we are root).
pub fn write_for_server(path: &Path, pem: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, pem).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    if nix::unistd::geteuid().is_root() {
        let user = nix::unistd::User::from_name("postgres").unwrap().unwrap();
        nix::unistd::chown(path, Some(user.uid), Some(user.gid)).unwrap();
    }
}

pub fn certs(server: &pg::PgServer) -> &'static Certs {
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
pub fn set_server_tls(admin: &pg::Admin, url: &str, pair: Option<&(PathBuf, PathBuf)>) {
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

pub fn setup() -> Option<(MutexGuard<'static, ()>, String, pg::Admin, &'static Certs)> {
    let guard = one_at_a_time();
    let server = pg::server()?;
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    let certs = certs(server);
    Some((guard, url, admin, certs))
}
