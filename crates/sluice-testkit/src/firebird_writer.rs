//! A concurrent writer for Firebird consistency tests, run as a process of its own
//! (`sluice-testkit firebird-writer`), so that the writes come from another engine instance
//! than the export's, as they do in production with a SuperClassic or Classic server.
//!
//! The table is a bank: `ACC (ID BIGINT PRIMARY KEY, BAL BIGINT, PAD CHAR(100))` with every
//! balance 1000 (the pad is random text, which record compression cannot shrink, so a number
//! of accounts takes the same pages on every Firebird version). The writer moves 5 from one random account to another (two UPDATEs) and
//! commits every `per_commit` transfers, so every committed state has the same total and the
//! same ids: an export that is one point in time has the total `1000 × accounts`; an export
//! that saw part of a transaction, or a record version other than its snapshot's, does not.
//!
//! With `log`, each commit is written as a line `tx <id> cn <commit number> <from> <to> …`
//! (the transaction's number, its commit number from `RDB$GET_TRANSACTION_CN`, and its
//! transfers), which lets a failing export be explained transfer by transfer.

use crate::firebird::FbConn;
use anyhow::{Context, Result};
use rsfbclient_core::{Dialect, FirebirdClientSqlOps, FreeStmtOp, SqlType, TrOp};
use std::io::Write;
use std::path::Path;

/// The amount each transfer moves.
pub const TRANSFER: i64 = 5;
/// The starting balance of every account.
pub const BALANCE: i64 = 1000;

/// Create the `ACC` table with `accounts` accounts (ids 1..=accounts) in the database at `path`
/// (the database file is created first, with 8 KB pages, if it does not exist).
pub fn create_accounts(path: &Path, accounts: u64) {
    if !path.exists() {
        crate::firebird::create_database(path, 8192);
    }
    let mut c = FbConn::attach(path);
    c.exec(&format!(
        "CREATE TABLE ACC (ID BIGINT NOT NULL PRIMARY KEY, BAL BIGINT NOT NULL, PAD CHAR(100))
         ;;
         EXECUTE BLOCK AS DECLARE I BIGINT = 1; BEGIN
           WHILE (I <= {accounts}) DO BEGIN
             INSERT INTO ACC VALUES (:I, {BALANCE}, LEFT(UUID_TO_CHAR(GEN_UUID())
               || UUID_TO_CHAR(GEN_UUID()) || UUID_TO_CHAR(GEN_UUID()), 100));
             I = I + 1;
           END
         END"
    ));
}

/// What the writer does.
#[derive(Debug, Clone)]
pub struct Transfers {
    /// Accounts 1..=accounts exist.
    pub accounts: u64,
    /// Transfers per transaction.
    pub per_commit: u32,
    /// The `SET TRANSACTION` statement each transaction starts with.
    pub set_transaction: String,
}

impl Default for Transfers {
    fn default() -> Self {
        Transfers {
            accounts: 1000,
            per_commit: 20,
            set_transaction: "SET TRANSACTION READ WRITE WAIT ISOLATION LEVEL SNAPSHOT".into(),
        }
    }
}

/// An update conflict or deadlock: the transaction must be undone and may be tried again.
fn is_conflict(e: &rsfbclient_core::FbError) -> bool {
    let m = e.to_string().to_lowercase();
    m.contains("update conflicts") || m.contains("deadlock")
}

/// Run transfers on the database at `path` until `stop` returns true (checked between
/// transactions); `committed` is called after every commit with the number of commits so far.
/// A transaction that meets an update conflict (a snapshot transaction updating an account
/// another transaction changed after it started) is rolled back and not counted.
/// Each commit is logged to `log` when given (see the module documentation).
pub fn run_transfers(
    path: &Path,
    spec: &Transfers,
    mut log: Option<&mut dyn Write>,
    stop: impl Fn() -> bool,
    mut committed: impl FnMut(u64),
) -> Result<()> {
    let mut conn = FbConn::attach(path);
    let FbConn { client, db } = &mut conn;
    let mut rng = rand::rng();
    let mut commits = 0u64;
    let mut tr = 0;
    client
        .exec_immediate(db, &mut tr, Dialect::D3, &spec.set_transaction)
        .context("starting the writer's first transaction")?;
    let (_, mut update) = client
        .prepare_statement(
            db,
            &mut tr,
            Dialect::D3,
            "UPDATE ACC SET BAL = BAL + ? WHERE ID = ?",
        )
        .context("preparing the transfer")?;
    // Only a logging writer asks for transaction and commit numbers (Firebird 4+).
    let mut prepare = |sql: &str| -> Result<Option<crate::firebird::StmtHandle>> {
        if log.is_none() {
            return Ok(None);
        }
        let (_, stmt) = client
            .prepare_statement(db, &mut tr, Dialect::D3, sql)
            .with_context(|| format!("preparing {sql}"))?;
        Ok(Some(stmt))
    };
    let mut whoami = prepare("SELECT CURRENT_TRANSACTION FROM RDB$DATABASE")?;
    let mut cn_of = prepare("SELECT RDB$GET_TRANSACTION_CN(CAST(? AS BIGINT)) FROM RDB$DATABASE")?;
    let one = |client: &mut crate::firebird::Client,
               db: &mut crate::firebird::DbHandle,
               tr: &mut crate::firebird::TrHandle,
               stmt: &mut crate::firebird::StmtHandle,
               params: Vec<SqlType>|
     -> Result<i64> {
        client.execute(db, tr, stmt, params)?;
        let row = client.fetch(db, tr, stmt)?.context("no row")?;
        client.free_statement(stmt, FreeStmtOp::Close)?;
        match row.first().map(|c| &c.value) {
            Some(SqlType::Integer(i)) => Ok(*i),
            other => anyhow::bail!("unexpected value {other:?}"),
        }
    };
    let mut moves = Vec::with_capacity(spec.per_commit as usize * 2);
    loop {
        moves.clear();
        let mut conflict = false;
        'transfers: for _ in 0..spec.per_commit {
            let from = rand::Rng::random_range(&mut rng, 1..=spec.accounts) as i64;
            let mut to = rand::Rng::random_range(&mut rng, 1..spec.accounts) as i64;
            if to >= from {
                to += 1;
            }
            for (delta, id) in [(-TRANSFER, from), (TRANSFER, to)] {
                match client.execute(
                    db,
                    &mut tr,
                    &mut update,
                    vec![SqlType::Integer(delta), SqlType::Integer(id)],
                ) {
                    Ok(1) => {}
                    Ok(_) => anyhow::bail!("account {id} does not exist"),
                    // Another transaction changed the account after this one started (a
                    // snapshot transaction cannot overwrite that): undo, as applications do.
                    Err(e) if is_conflict(&e) => {
                        conflict = true;
                        break 'transfers;
                    }
                    Err(e) => return Err(e).with_context(|| format!("updating account {id}")),
                }
            }
            moves.push((from, to));
        }
        let id = match whoami.as_mut().filter(|_| !conflict) {
            Some(stmt) => one(client, db, &mut tr, stmt, vec![])?,
            None => 0,
        };
        if conflict {
            client
                .transaction_operation(&mut tr, TrOp::Rollback)
                .context("rolling back transfers")?;
        } else {
            client
                .transaction_operation(&mut tr, TrOp::Commit)
                .context("committing transfers")?;
            commits += 1;
            committed(commits);
        }
        if stop() {
            break;
        }
        client
            .exec_immediate(db, &mut tr, Dialect::D3, &spec.set_transaction)
            .context("starting a writer transaction")?;
        if let (Some(out), Some(stmt)) = (log.as_deref_mut().filter(|_| !conflict), &mut cn_of) {
            let cn = one(client, db, &mut tr, stmt, vec![SqlType::Integer(id)])?;
            write!(out, "tx {id} cn {cn}")?;
            for (from, to) in &moves {
                write!(out, " {from} {to}")?;
            }
            writeln!(out)?;
        }
    }
    for stmt in [Some(&mut update), whoami.as_mut(), cn_of.as_mut()]
        .into_iter()
        .flatten()
    {
        let _ = client.free_statement(stmt, FreeStmtOp::Drop);
    }
    Ok(())
}
