//! An apply session made of the planner and an engine's connection: everything but the
//! barriers is the planner's ([`Planner`]), the same for every engine, so an adapter writes its
//! link ([`ApplyLink`]) and how a barrier runs there ([`Barriers`]), nothing else.

use super::{ApplyDialect, ApplyLink, Planner};
use crate::Result;
use crate::apply::{AppliedPosition, ApplySession, ApplyUnit, Barrier, SourceColumn};
use crate::table::TableRef;
use async_trait::async_trait;

/// How a barrier (a truncate, a column change) runs on an engine: the one part of a session
/// that differs by engine beyond the statements' spelling (PostgreSQL's DDL is transactional;
/// MySQL's commits by itself, so what the transaction holds is committed first).
#[async_trait]
pub trait Barriers<D: ApplyDialect>: ApplyLink {
    /// Run `barrier` for the unit being applied through `plan` (see
    /// [`ApplySession::barrier`]: `before` is the position of the unit's changes before it;
    /// `true` when the transaction was committed on the way).
    async fn barrier(
        &mut self,
        plan: &mut Planner<D>,
        barrier: &Barrier,
        before: &AppliedPosition,
    ) -> Result<bool>;
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
        self.link.barrier(&mut self.plan, barrier, before).await
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
