//! Firebird for tests: an embedded Firebird 5 runtime (no server) and a fresh database per test.
//!
//! [`Runtime::prepare`] (used by `sluice-testkit run --firebird`) installs the PyPI wheel
//! `firebird-embedded` ([`WHEEL`], or the one [`WHEEL_ENV`] names) into a virtual environment
//! under `~/.cache/sluice/firebird-venv` when it is missing, and builds a private runtime directory in a temporary directory: the wheel's
//! files hard-linked in, a copy of `firebird.conf` with `ServerMode = SuperClassic` (so the test
//! process and the `sluice` process can attach the same database file at once) and a private
//! lock directory. The engine needs Debian's `libtommath1` and `libtomcrypt1` (installed by
//! scripts/lib/common.sh).
//!
//! Environment exported to the command: `FIREBIRD` (the runtime directory, which the client
//! library reads before it loads), `FIREBIRD_LOCK`, `FBCLIENT` (the library),
//! `SLUICE_TEST_FIREBIRD_DIR` (where tests create databases) and `SLUICE_TEST_FIREBIRD_URL`
//! (`firebird:///<that dir>/`, to which a test appends its database file name).
//!
//! [`TestFdb`] is what tests use: a new database file with helpers to run SQL, on
//! attachments of the test process.

use crate::server::run;
use anyhow::{Context, Result};
use rsfbclient_core::{
    Column, Dialect, FbError, FirebirdClientDbOps, FirebirdClientSqlOps, FreeStmtOp, SqlType, TrOp,
    charset,
};
use rsfbclient_native::{DynLoad, NativeFbAttachmentConfig, NativeFbClient};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheel version the tests run against.
pub const WHEEL: &str = "firebird-embedded==5.0.4.4";

/// Names another wheel to run against (`firebird-embedded==4.0.7.4`, `…==3.0.14.4`), for
/// trying sluice on other Firebird versions without a server.
pub const WHEEL_ENV: &str = "SLUICE_TEST_FIREBIRD_WHEEL";

fn wheel() -> String {
    std::env::var(WHEEL_ENV).unwrap_or_else(|_| WHEEL.to_string())
}

fn venv_dir() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let cache = PathBuf::from(home).join(".cache/sluice");
    let wheel = wheel();
    Ok(if wheel == WHEEL {
        cache.join("firebird-venv")
    } else {
        let version: String = wheel
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        cache.join(format!("firebird-venv-{version}"))
    })
}

fn find_runtime(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    std::fs::read_dir(&lib)
        .ok()?
        .flatten()
        .map(|e| e.path().join("site-packages/firebird/embedded/runtime"))
        .find(|p| p.join("libfbclient.so.2").exists())
}

/// The wheel's runtime directory, installing the wheel first if needed.
pub fn installed_runtime() -> Result<PathBuf> {
    let venv = venv_dir()?;
    if let Some(rt) = find_runtime(&venv) {
        return Ok(rt);
    }
    let wheel = wheel();
    eprintln!("sluice-testkit: installing {wheel} into {}", venv.display());
    run(
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        "python3 -m venv (install Python 3 with its venv module)",
    )?;
    run(
        Command::new(venv.join("bin/pip")).args(["install", "-q", &wheel]),
        "pip install firebird-embedded",
    )?;
    find_runtime(&venv).context("the firebird-embedded wheel holds no runtime/libfbclient.so.2")
}

/// Lay out `src` at `dst` with hard links (copies where the file system refuses them):
/// Firebird 4 refuses to load a plugin whose path goes through a symbolic link ("Actual module
/// name does not match requested").
fn link_tree(src: &Path, dst: &Path) -> Result<()> {
    if src.is_dir() {
        std::fs::create_dir_all(dst)?;
        for e in std::fs::read_dir(src)?.flatten() {
            link_tree(&e.path(), &dst.join(e.file_name()))?;
        }
    } else if std::fs::hard_link(src, dst).is_err() {
        std::fs::copy(src, dst)
            .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    }
    Ok(())
}

/// A private embedded runtime in a temporary directory (deleted on drop).
pub struct Runtime {
    dir: tempfile::TempDir,
}

impl Runtime {
    /// Install (if needed) and lay out the runtime.
    pub fn prepare() -> Result<Self> {
        let wheel = installed_runtime()?;
        let dir = tempfile::Builder::new().prefix("sluice-fb-").tempdir()?;
        let root = dir.path().join("runtime");
        std::fs::create_dir_all(&root)?;
        for e in std::fs::read_dir(&wheel)?.flatten() {
            let name = e.file_name();
            if name == "firebird.conf" || name == "firebird.log" {
                continue;
            }
            link_tree(&e.path(), &root.join(&name))?;
        }
        let conf = std::fs::read_to_string(wheel.join("firebird.conf"))?;
        std::fs::write(
            root.join("firebird.conf"),
            format!(
                "{conf}\n# sluice tests: several processes attach one database\nServerMode = SuperClassic\n"
            ),
        )?;
        std::fs::create_dir_all(dir.path().join("lock"))?;
        std::fs::create_dir_all(dir.path().join("databases"))?;
        Ok(Runtime { dir })
    }

    /// The runtime directory (`FIREBIRD`).
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("runtime")
    }

    /// The environment the tests need.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let d = self.dir.path();
        let dbs = d.join("databases");
        vec![
            ("FIREBIRD", self.root().display().to_string()),
            ("FIREBIRD_LOCK", d.join("lock").display().to_string()),
            (
                "FBCLIENT",
                self.root().join("libfbclient.so.2").display().to_string(),
            ),
            ("SLUICE_TEST_FIREBIRD_DIR", dbs.display().to_string()),
            (
                "SLUICE_TEST_FIREBIRD_URL",
                format!("firebird://{}/", dbs.display()),
            ),
        ]
    }
}

fn need(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set, so there is no Firebird runtime to test against. Run \
             ./scripts/test, or wrap the command in `sluice-testkit run --firebird -- …`."
        )
    })
}

pub(crate) type Client = NativeFbClient<DynLoad>;
pub(crate) type DbHandle = <Client as FirebirdClientDbOps>::DbHandle;
pub(crate) type TrHandle = <Client as FirebirdClientSqlOps>::TrHandle;
pub(crate) type StmtHandle = <Client as FirebirdClientSqlOps>::StmtHandle;

/// One attachment of the test process (blocking calls).
pub struct FbConn {
    pub(crate) client: Client,
    pub(crate) db: DbHandle,
}

fn client() -> NativeFbClient<DynLoad> {
    need("FIREBIRD");
    let load = || {
        DynLoad {
            charset: charset::UTF_8,
            lib_path: need("FBCLIENT"),
        }
        .try_to_client()
        .unwrap_or_else(|e| panic!("loading the Firebird client library: {e}"))
    };
    // Unloading the embedded engine while its threads run aborts the process: keep one handle.
    static KEEP: std::sync::Once = std::sync::Once::new();
    KEEP.call_once(|| std::mem::forget(load()));
    load()
}

fn config(path: &Path) -> NativeFbAttachmentConfig {
    NativeFbAttachmentConfig {
        db_name: path.display().to_string(),
        user: "SYSDBA".into(),
        role_name: None,
        remote: None,
    }
}

/// Shut the embedded engine down from an exit handler of our own. The client library also
/// shuts itself down from its static destructors at exit, and that can deadlock with an
/// embedded engine; our handler is registered after the engine's plugins are loaded (after the
/// first attachment), so it runs before their destructors, which then find nothing to do.
fn shut_down_at_exit() {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    REGISTER.call_once(|| {
        // SAFETY: registering a plain `extern "C" fn()` with atexit.
        #[allow(unsafe_code)]
        unsafe {
            libc::atexit(engine_shutdown);
        }
    });
}

extern "C" fn engine_shutdown() {
    // No panics here: this runs inside exit(). FBCLIENT was set when the engine was loaded.
    if let Ok(lib) = std::env::var("FBCLIENT") {
        sluice_firebird::connect::shutdown_library(&lib, std::time::Duration::from_secs(10));
    }
}

impl FbConn {
    /// Attach the database at `path`.
    pub fn attach(path: &Path) -> FbConn {
        let mut client = client();
        let db = client
            .attach_database(&config(path), Dialect::D3, false)
            .unwrap_or_else(|e| panic!("attaching {}: {e}", path.display()));
        shut_down_at_exit();
        FbConn { client, db }
    }

    /// Run statements, each in its own committed transaction. A statement may be an
    /// `EXECUTE BLOCK`; statements are separated by lines holding only `;;`.
    pub fn exec(&mut self, sql: &str) {
        let mut stmt = String::new();
        for line in sql.lines().chain([";;"]) {
            if line.trim() == ";;" {
                let s = stmt.trim();
                if !s.is_empty() {
                    self.try_exec(s).unwrap_or_else(|e| panic!("{s}: {e}"));
                }
                stmt.clear();
            } else {
                stmt.push_str(line);
                stmt.push('\n');
            }
        }
    }

    /// Run one statement in its own transaction; errors are returned.
    pub fn try_exec(&mut self, stmt: &str) -> Result<(), FbError> {
        let mut tr = self
            .client
            .begin_transaction(&mut self.db, Default::default())?;
        match self
            .client
            .exec_immediate(&mut self.db, &mut tr, Dialect::D3, stmt)
        {
            Ok(()) => self.client.transaction_operation(&mut tr, TrOp::Commit),
            Err(e) => {
                let _ = self.client.transaction_operation(&mut tr, TrOp::Rollback);
                Err(e)
            }
        }
    }

    /// Rows of `sql` as sorted `v1|v2|…` strings (NULL as `∅`), read in a transaction started
    /// with `set_transaction` (e.g. joining a snapshot by number), or a fresh one.
    pub fn row_strings_in(&mut self, set_transaction: Option<&str>, sql: &str) -> Vec<String> {
        let mut tx = match set_transaction {
            Some(st) => self.begin(st),
            None => Tx(self
                .client
                .begin_transaction(&mut self.db, Default::default())
                .unwrap_or_else(|e| panic!("begin: {e}"))),
        };
        let mut out = self.query_in(&mut tx, sql);
        self.commit(tx);
        out.sort();
        out
    }

    /// Start a transaction with a `SET TRANSACTION …` statement; it stays open until
    /// [`FbConn::commit`], so tests can hold snapshots and uncommitted changes.
    pub fn begin(&mut self, set_transaction: &str) -> Tx {
        let mut tr = 0;
        self.client
            .exec_immediate(&mut self.db, &mut tr, Dialect::D3, set_transaction)
            .unwrap_or_else(|e| panic!("{set_transaction}: {e}"));
        Tx(tr)
    }

    /// Rows of `sql` in `tx`, in the order read, as `v1|v2|…` strings.
    pub fn query_in(&mut self, tx: &mut Tx, sql: &str) -> Vec<String> {
        let (_, mut stmt) = self
            .client
            .prepare_statement(&mut self.db, &mut tx.0, Dialect::D3, sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        self.client
            .execute(&mut self.db, &mut tx.0, &mut stmt, vec![])
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let mut out = Vec::new();
        while let Some(row) = self
            .client
            .fetch(&mut self.db, &mut tx.0, &mut stmt)
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
        {
            out.push(row.iter().map(show).collect::<Vec<_>>().join("|"));
        }
        let _ = self.client.free_statement(&mut stmt, FreeStmtOp::Drop);
        out
    }

    /// Run a statement that returns no rows in `tx`.
    pub fn exec_in(&mut self, tx: &mut Tx, sql: &str) {
        self.client
            .exec_immediate(&mut self.db, &mut tx.0, Dialect::D3, sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Commit `tx`.
    pub fn commit(&mut self, mut tx: Tx) {
        self.client
            .transaction_operation(&mut tx.0, TrOp::Commit)
            .unwrap_or_else(|e| panic!("commit: {e}"));
    }

    /// Rows of `sql` in a fresh transaction, as sorted strings.
    pub fn row_strings(&mut self, sql: &str) -> Vec<String> {
        self.row_strings_in(None, sql)
    }
}

/// A transaction open on an [`FbConn`] (see [`FbConn::begin`]); one that is never committed is
/// rolled back when its attachment detaches.
pub struct Tx(TrHandle);

fn show(c: &Column) -> String {
    match &c.value {
        SqlType::Null => "∅".into(),
        SqlType::Text(t) => t.clone(),
        SqlType::Integer(i) => i.to_string(),
        SqlType::Int128(i) => i.to_string(),
        SqlType::Floating(f) => f.to_string(),
        SqlType::Timestamp(t) => t.to_string(),
        SqlType::Binary(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
        SqlType::Boolean(b) => b.to_string(),
    }
}

impl Drop for FbConn {
    fn drop(&mut self) {
        let _ = self.client.detach_database(&mut self.db);
    }
}

/// Create an empty database file at `path` with pages of `page_size` bytes.
pub fn create_database(path: &Path, page_size: u32) {
    let mut c = client();
    let mut db = c
        .create_database(&config(path), Some(page_size), Dialect::D3)
        .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    let _ = c.detach_database(&mut db);
    shut_down_at_exit();
}

/// Tests of one process use the embedded engine one at a time (held for a test's lifetime), so
/// a binary's Firebird tests run in turn: each already runs several processes and attachments,
/// and the timing of one cannot disturb another.
static ONE_TEST_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A database created for one test.
pub struct TestFdb {
    /// The database file.
    pub path: PathBuf,
    /// Its embedded URL, `firebird:///…`.
    pub url: String,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl TestFdb {
    /// Create a database with a random name and 4 KB pages (the smallest, so that small test
    /// tables already span several pointer pages).
    pub fn new() -> TestFdb {
        let turn = ONE_TEST_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let dir = PathBuf::from(need("SLUICE_TEST_FIREBIRD_DIR"));
        let path = dir.join(format!("t_{:016x}.fdb", rand::random::<u64>()));
        create_database(&path, 4096);
        let url = format!("firebird://{}", path.display());
        TestFdb {
            path,
            url,
            _turn: turn,
        }
    }

    /// A new attachment.
    pub fn attach(&self) -> FbConn {
        FbConn::attach(&self.path)
    }

    /// Run statements (see [`FbConn::exec`]) on a new attachment.
    pub fn exec(&self, sql: &str) {
        self.attach().exec(sql);
    }

    /// Rows of `sql` as sorted strings, on a new attachment.
    pub fn row_strings(&self, sql: &str) -> Vec<String> {
        self.attach().row_strings(sql)
    }
}

impl Default for TestFdb {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestFdb {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
