//! Foreign keys whose actions change rows the source's log does not carry.
//!
//! InnoDB applies `ON DELETE CASCADE`, `SET NULL` and the `ON UPDATE` actions inside the storage
//! engine, and MariaDB and MySQL up to 9.5 write the rows they change to no binary log
//! ([`ChangeSource::logs_cascades`]). A captured child table of such a key would silently
//! miss those changes, so:
//!
//! - `sluice stream` refuses it, unless `--accept-missing-cascades` says the user knows; the
//!   state and the change files' metadata (`sluice.missing_changes`) then record what is
//!   missing;
//! - `sluice replicate` lets the target apply the cascade itself: the key is created on the
//!   target with its action once the initial load is in (`ApplyTarget::add_foreign_keys`),
//!   the parent's delete is applied after every earlier change of its children (their
//!   writesets hold the parent's key) and the target deletes or nulls the children as the
//!   source did. What the target cannot follow is refused up front: a parent that is not
//!   replicated (its deletes never reach the target), `ON UPDATE` actions (a key update is
//!   applied as a delete and an insert, which would cascade as a delete), `SET DEFAULT`
//!   (the target's tables carry no defaults);
//! - a converged export (`--consistency converged`, and `sluice stream`'s converged snapshot)
//!   refuses it outright: a child row the action changes after its chunk was read would stay
//!   in the output as it was, with nothing in the log to say its key changed, so the output
//!   would not be the table at one point. Nothing to accept: `--consistency snapshot` reads
//!   such tables exactly.

use sluice_core::apply::{ForeignKey, RefAction, TableKeys};
use sluice_core::change::ChangeSource;
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};

/// The captured tables' foreign keys whose actions change rows the source's log leaves out.
pub(crate) fn unlogged(
    source: &dyn ChangeSource,
    keys: &[TableKeys],
) -> Vec<(TableRef, ForeignKey)> {
    if source.logs_cascades() {
        return Vec::new();
    }
    keys.iter()
        .flat_map(|k| {
            k.foreign
                .iter()
                .filter(|f| !f.child_actions().is_empty())
                .map(|f| (k.table.clone(), f.clone()))
        })
        .collect()
}

/// What a table's change files miss, in words (the state and the files' metadata keep it).
pub(crate) fn missing_note(source: &dyn ChangeSource, fk: &ForeignKey) -> String {
    format!(
        "{}: rows it changes in this table are not in {}'s binary log, so these change files \
         miss them",
        fk.describe(),
        source.display_url()
    )
}

/// `sluice stream`: refuse tables with such keys unless the user accepted the loss.
pub(crate) fn check_stream(
    source: &dyn ChangeSource,
    found: &[(TableRef, ForeignKey)],
    accepted: bool,
) -> Result<()> {
    if found.is_empty() || accepted {
        for (t, fk) in found {
            tracing::warn!(
                "{t}: {} (--accept-missing-cascades)",
                missing_note(source, fk)
            );
        }
        return Ok(());
    }
    let list: Vec<String> = found
        .iter()
        .map(|(t, fk)| format!("{t}: {}", fk.describe()))
        .collect();
    Err(Error::config(format!(
        "{} applies these foreign keys' actions inside the storage engine and writes the rows \
         they change to no binary log, so the change files of the child tables would miss \
         them: {}. Leave those tables out of the stream, change the keys' actions, or pass \
         --accept-missing-cascades to stream them knowing that those changes are missing (the \
         state and the files' metadata say so).",
        source.display_url(),
        list.join("; ")
    )))
}

/// A converged export: refuse tables with such keys, naming them and the fallback.
pub(crate) fn check_converged(
    source: &dyn ChangeSource,
    found: &[(TableRef, ForeignKey)],
) -> Result<()> {
    let Some((t, fk)) = found.first() else {
        return Ok(());
    };
    Err(Error::config(format!(
        "{t}: {}: {} applies this action inside the storage engine and writes the rows it \
         changes to no binary log, so a converged export could not tell which of {t}'s rows \
         changed after their chunk was read, and the output would not be the table at one \
         point. Export {t} with --consistency snapshot (one snapshot for the run), or leave \
         it out of the selection.",
        fk.describe(),
        source.display_url()
    )))
}

/// `sluice replicate`: the keys the target must create to apply the cascades itself; refuses
/// what it cannot follow. `captured`: the replicated tables.
pub(crate) fn check_replicate(
    source: &dyn ChangeSource,
    found: &[(TableRef, ForeignKey)],
    captured: &[TableRef],
) -> Result<()> {
    for (t, fk) in found {
        let why = if !captured.contains(&fk.parent) {
            Some(format!(
                "its parent {} is not replicated, so the deletes that cascade never reach the \
                 target",
                fk.parent
            ))
        } else if fk.on_update.changes_children() {
            Some(
                "sluice applies an update of a key as a delete and an insert, so the target \
                 could not follow an ON UPDATE action"
                    .to_string(),
            )
        } else if fk.on_delete == RefAction::SetDefault {
            Some("the target's tables carry no column defaults".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::config(format!(
                "{t}: {}: {} writes the rows this key's action changes to no binary log, and \
                 the target cannot apply the action itself: {why}. Leave {t} out of the \
                 selection, or change the key's action.",
                fk.describe(),
                source.display_url()
            )));
        }
    }
    Ok(())
}
