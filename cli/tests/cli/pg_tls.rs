//! `run --pg-ca` and `status --pg-ca`: the command line over TLS, against this binary's
//! throwaway server switched to TLS with a certificate of a throwaway CA.

#![cfg(feature = "postgres-tls")]
#![allow(clippy::unwrap_used)]

use std::path::Path;

use crate::tls::{set_server_tls, setup};

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
