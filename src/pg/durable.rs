//! When a commit counts: the judgements behind "no grant, renew or release is reported on a
//! commit that may not be durable" (PROTOCOL §8.6).
//!
//! With synchronous replication, the committing backend writes and flushes its commit record,
//! marks the transaction committed, and then waits for the standbys to confirm; other sessions
//! see the transaction as still in progress until that wait ends. If the wait is cut short
//! (the library ends a stuck session, an administrator terminates or cancels it, the server
//! shuts down), the commit becomes visible on the primary alone, and is lost if the primary
//! fails over. A cancel is answered with success and a WARNING; `statement_timeout` does not
//! end the wait. So a re-read that finds our record after a commit whose reply never came,
//! or a success that came with a warning, proves the commit durable only when no standby had
//! to confirm it, or when the standbys that must confirm it have confirmed the primary's WAL
//! position as of the re-read. Everything else is
//! [`Error::CommitUnknown`](crate::Error::CommitUnknown) (for a fenced section,
//! [`Error::FencedCommitUnknown`](crate::Error::FencedCommitUnknown)). The judgement itself is
//! backend-neutral and pure ([`crate::commit`]): the model checker runs it too.

pub(crate) use crate::commit::{Reread, Verdict, standbys_required, verdict};

/// The `synchronous_commit` levels that wait at least for what the server's replication
/// settings require: `on` (the local flush, and the synchronous standbys' flush when
/// `synchronous_standby_names` names any) and `remote_apply`. The library's sessions run with
/// the server's setting when it is one of these, and with `on` otherwise (`off`, `local` and
/// `remote_write` would let a grant be reported that a crash or a failover undoes).
pub(crate) const DURABLE_ENOUGH: [&str; 2] = ["on", "remote_apply"];

/// The statement that makes a session's `synchronous_commit` durable enough (see
/// [`DURABLE_ENOUGH`]); it never weakens the server's own level.
pub(crate) fn synchronous_commit_setting() -> String {
    let kept = DURABLE_ENOUGH
        .iter()
        .map(|l| format!("'{l}'"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT set_config('synchronous_commit', CASE WHEN current_setting('synchronous_commit') \
         IN ({kept}) THEN current_setting('synchronous_commit') ELSE 'on' END, false)"
    )
}

/// Read with the row by the re-read: the standbys that must confirm commits, and the WAL
/// position (at or past the commit record of any commit the re-read sees).
pub(crate) const WAL_POSITION: &str =
    "SELECT current_setting('synchronous_standby_names'), pg_current_wal_lsn()::text";

/// How many synchronous standbys have confirmed WAL position `$1` (flushed it, or applied it
/// when the session's level is `remote_apply`). The positions are visible to superusers and
/// members of `pg_monitor` (`pg_read_all_stats`) only: for other roles the count is 0.
pub(crate) const CONFIRMED_STANDBYS: &str = "SELECT count(*)::int8 FROM pg_stat_replication \
     WHERE sync_state IN ('sync', 'quorum') AND (CASE WHEN current_setting('synchronous_commit') \
     = 'remote_apply' THEN replay_lsn ELSE flush_lsn END) >= $1::text::pg_lsn";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_level_keeps_only_the_durable_levels() {
        let sql = synchronous_commit_setting();
        assert!(sql.contains("IN ('on', 'remote_apply')"), "{sql}");
        assert!(sql.contains("ELSE 'on' END"), "{sql}");
    }
}
