//! The lease tables, created by the library on first use, and their version.
//!
//! ```sql
//! CREATE TABLE flocklease_leases (
//!     id     text        PRIMARY KEY,        -- the session id
//!     key    int4        GENERATED ALWAYS AS IDENTITY UNIQUE,  -- first advisory-lock key
//!     owner  text        NOT NULL,           -- '' = released (tombstone)
//!     token  bigint      NOT NULL,           -- the u64 fencing token's bits
//!     expiry timestamptz NOT NULL
//! );
//! CREATE TABLE flocklease_schema (version int4 NOT NULL);  -- one row: 1
//! ```
//!
//! A row is never deleted, so tokens stay monotone. A row with token 0 and an empty owner is
//! the placeholder a transition inserts to have something to lock: it reads as "no record".
//! Advisory locks are per database, not per schema: a second lease table in another schema of
//! the same database is refused ([`Error::SharedLockSpace`]).
//! The liveness lock of generation `(id, token)` is the session advisory lock
//! `(key, token mod 2^32)` in the two-`int4` key space, which is disjoint from the `bigint`
//! keys that migration tools take.

use std::time::Duration;

use tokio::runtime::Runtime;
use tokio_postgres::Config;

use super::conn::within;
use super::tls::Connector;

use crate::error::Error;

/// The lease table.
pub const TABLE: &str = "flocklease_leases";
/// The table holding the schema version.
pub const VERSION_TABLE: &str = "flocklease_schema";
/// The schema version this library creates and accepts.
pub const VERSION: i32 = 1;

/// Serializes the creation of the tables by concurrent first users (a `bigint` advisory key:
/// "flocklea" in ASCII).
const CREATE_LOCK: i64 = 0x666c_6f63_6b6c_6561;

/// Creates the tables if missing and checks their version, giving up after `bound` (see
/// [`within`]).
pub(super) fn ensure(
    rt: &Runtime,
    connector: &Connector,
    config: &Config,
    bound: Duration,
) -> Result<(), Error> {
    let db = |op| {
        move |e: tokio_postgres::Error| match super::conn::pooler_symptom(&e) {
            Some(detail) => Error::SessionNotKept { detail },
            None => Error::Database {
                op,
                id: None,
                source: Box::new(e),
            },
        }
    };
    within(rt, bound, async {
        let (mut client, connection) = connector.connect(config).await.map_err(db("connect"))?;
        let task = tokio::spawn(connection);
        let tx = client
            .transaction()
            .await
            .map_err(db("create the lease tables"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK])
            .await
            .map_err(db("create the lease tables"))?;
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (
                 id text PRIMARY KEY,
                 key int4 GENERATED ALWAYS AS IDENTITY UNIQUE,
                 owner text NOT NULL,
                 token bigint NOT NULL,
                 expiry timestamptz NOT NULL
             );
             CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version int4 NOT NULL);
             INSERT INTO {VERSION_TABLE} (version)
                 SELECT {VERSION} WHERE NOT EXISTS (SELECT 1 FROM {VERSION_TABLE});"
        ))
        .await
        .map_err(db("create the lease tables"))?;
        let found: i32 = tx
            .query_one(&format!("SELECT min(version) FROM {VERSION_TABLE}"), &[])
            .await
            .map_err(db("read the schema version"))?
            .try_get(0)
            .map_err(db("read the schema version"))?;
        let schemas: Vec<String> = tx
            .query(
                &format!(
                    "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n \
                     ON n.oid = c.relnamespace WHERE c.relname = '{TABLE}' AND c.relkind = 'r' \
                     ORDER BY 1"
                ),
                &[],
            )
            .await
            .map_err(db("read the schema version"))?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(db("read the schema version"))?;
        tx.commit().await.map_err(db("create the lease tables"))?;
        drop(client);
        let _ = task.await;
        if schemas.len() > 1 {
            return Err(Error::SharedLockSpace { schemas });
        }
        if found != VERSION {
            return Err(Error::SchemaVersion {
                found,
                expected: VERSION,
            });
        }
        Ok(())
    })
    .map_err(|fail| fail.into_error("create the lease tables", None))?
}
