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
//! the same database is refused ([`Error::SharedLockSpace`]). So there is one lease table per
//! database, and every client uses it, schema-qualified, whatever its `search_path`; the
//! tables are created in the first schema of the creating client's `search_path` when no
//! schema holds one, and only then is the CREATE privilege needed (afterwards SELECT, INSERT
//! and UPDATE on the lease table and SELECT on the version table suffice).
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

/// The columns the lease table must have, as `format_type` names them.
const COLUMNS: [(&str, &str); 5] = [
    ("id", "text"),
    ("key", "integer"),
    ("owner", "text"),
    ("token", "bigint"),
    ("expiry", "timestamp with time zone"),
];

/// What is wrong with a lease table's columns (`(name, type)` as the server lists them), or
/// `None` when every column the library uses is there with its type. Other columns are the
/// operator's business.
pub(crate) fn shape_problem(found: &[(String, String)]) -> Option<String> {
    let wrong: Vec<String> = COLUMNS
        .iter()
        .filter_map(|(name, ty)| match found.iter().find(|(n, _)| n == name) {
            Some((_, t)) if t == ty => None,
            Some((_, t)) => Some(format!("column {name} is {t}, not {ty}")),
            None => Some(format!("column {name} ({ty}) is missing")),
        })
        .collect();
    (!wrong.is_empty()).then(|| wrong.join("; "))
}

/// `name` as an SQL identifier, quoted.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Finds the lease table (in whichever schema of the database holds it, so every client uses
/// the same one whatever its `search_path`), creates the tables in the first schema of the
/// `search_path` if no schema holds one (only then is the CREATE privilege needed), checks
/// the server is writable, the table's shape and its version, and returns the table's
/// schema-qualified name, giving up after `bound` (see [`within`]).
pub(super) fn ensure(
    rt: &Runtime,
    connector: &Connector,
    config: &Config,
    bound: Duration,
) -> Result<String, Error> {
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
    let unfit = |detail: String, remedy: &str| Error::UnfitServer {
        detail,
        remedy: remedy.to_owned(),
    };
    within(rt, bound, async {
        let (mut client, connection) = connector
            .connect(config, Default::default())
            .await
            .map_err(db("connect"))?;
        let task = tokio::spawn(connection);
        let writable = client
            .query_one(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')",
                &[],
            )
            .await
            .map_err(db("check that the server is writable"))?;
        let standby: bool = writable
            .try_get(0)
            .map_err(db("check that the server is writable"))?;
        let read_only: String = writable
            .try_get(1)
            .map_err(db("check that the server is writable"))?;
        if standby {
            return Err(unfit(
                "the server is a standby (in recovery): it cannot record a grant".into(),
                "connect to the primary; with several hosts in the connection string, add \
                 target_session_attrs=read-write",
            ));
        }
        if read_only == "on" {
            return Err(unfit(
                "the session is read-only (default_transaction_read_only is on)".into(),
                "connect as a role or to a database whose default_transaction_read_only is off",
            ));
        }
        let tx = client
            .transaction()
            .await
            .map_err(db("create the lease tables"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CREATE_LOCK])
            .await
            .map_err(db("create the lease tables"))?;
        let schemas: Vec<String> = tx
            .query(
                &format!(
                    "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n \
                     ON n.oid = c.relnamespace WHERE c.relname = '{TABLE}' AND c.relkind = 'r' \
                     AND c.relpersistence <> 't' \
                     ORDER BY 1"
                ),
                &[],
            )
            .await
            .map_err(db("find the lease table"))?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(db("find the lease table"))?;
        let schema = match schemas.as_slice() {
            [] => {
                let first: Option<String> = tx
                    .query_one("SELECT current_schema()::text", &[])
                    .await
                    .and_then(|r| r.try_get(0))
                    .map_err(db("find the lease table"))?;
                let Some(schema) = first else {
                    return Err(unfit(
                        "no schema of the search_path exists to create the lease tables in".into(),
                        "create a schema the role may create tables in, or set search_path",
                    ));
                };
                let s = quote_ident(&schema);
                tx.batch_execute(&format!(
                    "CREATE TABLE {s}.{TABLE} (
                         id text PRIMARY KEY,
                         key int4 GENERATED ALWAYS AS IDENTITY UNIQUE,
                         owner text NOT NULL,
                         token bigint NOT NULL,
                         expiry timestamptz NOT NULL
                     );
                     CREATE TABLE IF NOT EXISTS {s}.{VERSION_TABLE} (version int4 NOT NULL);
                     INSERT INTO {s}.{VERSION_TABLE} (version)
                         SELECT {VERSION} WHERE NOT EXISTS (SELECT 1 FROM {s}.{VERSION_TABLE});"
                ))
                .await
                .map_err(db("create the lease tables"))?;
                schema
            }
            [one] => one.clone(),
            _ => return Err(Error::SharedLockSpace { schemas }),
        };
        let table = format!("{}.{TABLE}", quote_ident(&schema));
        let columns: Vec<(String, String)> = tx
            .query(
                "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute \
                 WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped",
                &[&table],
            )
            .await
            .map_err(db("read the lease table's columns"))?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(db("read the lease table's columns"))?;
        if let Some(problem) = shape_problem(&columns) {
            return Err(unfit(
                format!("the lease table {table} is not the library's: {problem}"),
                "drop or rename that table (it is no lease table of this library), or use \
                 another database",
            ));
        }
        let found: Option<i32> = tx
            .query_one(
                &format!(
                    "SELECT min(version) FROM {}.{VERSION_TABLE}",
                    quote_ident(&schema)
                ),
                &[],
            )
            .await
            .and_then(|r| r.try_get(0))
            .map_err(db("read the schema version"))?;
        tx.commit().await.map_err(db("create the lease tables"))?;
        drop(client);
        let _ = task.await;
        let found = found.unwrap_or(0);
        if found != VERSION {
            return Err(Error::SchemaVersion {
                found,
                expected: VERSION,
            });
        }
        Ok(table)
    })
    .map_err(|fail| fail.into_error("create the lease tables", None))?
}
