//! An apply session made of the planner and an engine's connection: everything but the
//! barriers is the planner's ([`Planner`]), the same for every engine, so an adapter writes its
//! link ([`ApplyLink`]) and how a barrier runs there ([`Barriers`]), nothing else.

use super::{ApplyDialect, ApplyLink, Planner};
use crate::Result;
use crate::apply::{AppliedPosition, ApplySession, ApplyUnit, Barrier, ColumnChange, SourceColumn};
use crate::table::TableRef;
use async_trait::async_trait;

/// How a barrier (a truncate, a column change) runs on an engine: the one part of a session
/// that differs by engine beyond the statements' spelling. Where DDL is transactional
/// (PostgreSQL) the barrier's statements join the unit's transaction; where it commits by
/// itself (MySQL/MariaDB) the session first commits what the transaction holds together with
/// the position before the barrier, so a crash between the barrier and the unit's end
/// restarts exactly after the changes already applied (and runs the barrier again: it is
/// idempotent), and opens a new transaction after it.
#[async_trait]
pub trait Barriers<D: ApplyDialect>: ApplyLink {
    /// DDL commits by itself on this engine (see the trait's documentation).
    const DDL_COMMITS: bool;

    /// Remove every row of `tables`: buffered in `plan` or run on the link.
    async fn truncate(&mut self, plan: &mut Planner<D>, tables: &[TableRef]) -> Result<()>;

    /// Alter `change.table` to `change.columns`: buffered in `plan` or run on the link.
    async fn alter(&mut self, plan: &mut Planner<D>, change: &ColumnChange) -> Result<()>;
}

/// An [`ApplySession`] of a planner and an engine's link.
pub struct PlannedSession<D, L> {
    plan: Planner<D>,
    link: L,
}

impl<D, L> PlannedSession<D, L> {
    /// A session sending `plan`'s statements through `link`.
    pub fn new(plan: Planner<D>, link: L) -> Self {
        PlannedSession { plan, link }
    }
}

#[async_trait]
impl<D: ApplyDialect + 'static, L: Barriers<D> + 'static> ApplySession for PlannedSession<D, L> {
    async fn begin(&mut self) -> Result<()> {
        self.plan.begin();
        Ok(())
    }

    async fn apply(&mut self, unit: &ApplyUnit) -> Result<()> {
        self.plan.apply(unit, &mut self.link).await
    }

    async fn barrier(&mut self, barrier: &Barrier, before: &AppliedPosition) -> Result<bool> {
        let (plan, link) = (&mut self.plan, &mut self.link);
        if L::DDL_COMMITS {
            plan.record(before);
            plan.commit_interim(link).await?;
        } else {
            plan.send(link).await?;
        }
        match barrier {
            Barrier::Truncate(tables) => link.truncate(plan, tables).await?,
            Barrier::Columns(change) => link.alter(plan, change).await?,
        }
        if L::DDL_COMMITS {
            plan.resume();
        } else {
            plan.send(link).await?;
        }
        Ok(L::DDL_COMMITS)
    }

    async fn send(&mut self) -> Result<()> {
        self.plan.send(&mut self.link).await
    }

    async fn record(&mut self, position: &AppliedPosition) -> Result<()> {
        self.plan.record(position);
        Ok(())
    }

    async fn commit(&mut self) -> Result<()> {
        self.plan.commit(&mut self.link).await
    }

    async fn rollback(&mut self) -> Result<()> {
        self.plan.rollback(&mut self.link).await
    }

    async fn columns(&mut self, table: &TableRef, columns: &[SourceColumn]) -> Result<()> {
        self.plan.followed(table, &SourceColumn::list_json(columns));
        Ok(())
    }

    fn unmatched(&self) -> u64 {
        self.plan.unmatched()
    }
}
