//! A restart that stopped before its end, run again (issue 53): `--restart` replaces the output's rows with the
//! write's, and a stop (ctrl-C, a kill, a failure) leaves the rows it committed. Running the same restart again
//! would replace them and embed them again: instead, a restart of the very write whose restart stopped (the same
//! query, id column, sources and fingerprint, which make the same rows) resumes it, and says so. A restart of
//! anything else replaces the rows, as asked, and so does a restart of a write whose sources cannot be checked (an
//! object store, a table in memory): nothing says it would read the same rows.
//!
//! Each commit of a restart records the digest of what it writes (`RunRecord::write_digest`) and that it
//! restarted; the last commit of a write that stopped says it was interrupted, and a killed write's last commit
//! is an intermediate one: either way the newest record says the restart is unfinished.

use crate::campaign::RunRecord;
use crate::error::Result;
use crate::lance::records::{fingerprint_of_dataset, newest_run_record};
use crate::lance::sink::{check_fingerprint, fingerprint_of_columns};
use crate::lance::target::{WriteTarget, open_existing};
use crate::options::EmbedOptions;
use crate::session::EmbedSession;

/// Noted while a restart (or a run that goes on with one) writes: its records carry the write's digest, and a
/// restart turned into a resume is a restart again for the session's next statements once it is dropped.
pub struct RestartGuard<'a> {
    session: &'a EmbedSession,
    uri: String,
    resumed: bool,
}

impl Drop for RestartGuard<'_> {
    fn drop(&mut self) {
        self.session.metrics().note_write_digest(&self.uri, None);
        if self.resumed {
            set_restart(self.session, true);
        }
    }
}

/// What a restart of `target` finds: `Some` when it writes under a digest (a restart, or a run that goes on with
/// an unfinished restart of the same write), with `resumed` set when a restart goes on with the one that stopped.
/// Said to `note` when it resumes.
pub async fn prepare_restart<'a>(
    session: &'a EmbedSession,
    target: &WriteTarget,
    note: &dyn Fn(&str),
) -> Result<Option<RestartGuard<'a>>> {
    let options = EmbedOptions::from_config(session.local_state().config_options());
    let existing = open_existing(&target.uri).await?;
    let mut unfinished: Option<(u64, RunRecord)> = None;
    if let Some(ds) = &existing {
        let newest = newest_run_record(ds, ds.version().version, |_| true).await?;
        let same_model = check_fingerprint(
            &target.uri,
            fingerprint_of_dataset(ds)?.as_ref(),
            fingerprint_of_columns(target.input.schema().as_arrow())?.as_ref(),
        )
        .is_ok();
        unfinished = newest.filter(|(_, r)| r.restarted && r.unfinished() && r.write_digest.is_some() && same_model);
    }
    if !options.restart && unfinished.is_none() {
        return Ok(None);
    }
    let Some(digest) = super::plan::write_identity(target, &options.id_column).await? else { return Ok(None) };
    let same = unfinished.filter(|(_, r)| r.write_digest.as_deref() == Some(digest.as_str()));
    if !options.restart && same.is_none() {
        return Ok(None);
    }
    let resumed = options.restart && same.is_some();
    if let (true, Some((version, _)), Some(ds)) = (resumed, &same, &existing) {
        let rows = ds.count_rows(None).await.map_err(crate::lance::lance_err(&target.uri))?;
        note(&format!(
            "resuming the restart of {} that stopped at version {version} with {rows} rows: this is the same write \
             (query, ids, sources and model), so its rows are kept and the rest written; --restart replaces the rows \
             again once that restart has finished",
            target.uri
        ));
        set_restart(session, false);
    }
    session.metrics().note_write_digest(&target.uri, Some(digest));
    Ok(Some(RestartGuard { session, uri: target.uri.clone(), resumed }))
}

/// Set `embed.restart` in the session, as `SET embed.restart = …` would.
fn set_restart(session: &EmbedSession, restart: bool) {
    let state = session.context().state_ref();
    let mut state = state.write();
    // The key and value are this crate's own: setting them cannot fail.
    let _ = state.config_mut().options_mut().set("embed.restart", if restart { "true" } else { "false" });
}
