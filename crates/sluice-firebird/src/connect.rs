//! Connecting: URL parsing, finding the client library, and one thread per session.
//!
//! # URLs
//! - `firebird:///abs/path/db.fdb` — **embedded**: the engine runs inside sluice's process,
//!   no server. The client library is found through `FIREBIRD` (the embedded runtime's
//!   directory, which must hold `libfbclient.so.2`, `plugins/`, `firebird.conf`) and must be
//!   told where it is before it loads, so `FIREBIRD` must be set. Several processes can share
//!   the file only with `ServerMode = SuperClassic` in that directory's `firebird.conf`.
//! - `firebird://user[:password]@host[:port]//abs/path/db.fdb` — a **server** (default port
//!   3050); `firebird://user@host/employee` names a database alias.
//!
//! The user defaults to `ISC_USER`, then `SYSDBA`; the password to `ISC_PASSWORD` (an embedded
//! attachment needs none). Query parameters: `role=NAME`, `fbclient=PATH` (the client library;
//! else `FBCLIENT`, else `$FIREBIRD/libfbclient.so.2` or `$FIREBIRD/lib/libfbclient.so.2`,
//! else `libfbclient.so.2` on the loader's path).
//!
//! # Threads
//! The client library is blocking. Each [`Session`] owns one attachment on a thread of its
//! own and runs closures sent to it, so the async engine never blocks on a database call and
//! the attachment never moves between threads.
//!
//! Length: URL parsing, loading the library (and the two entry points the Rust bindings do
//! not expose, `fb_shutdown` and `isc_transaction_info`) and the session threads all concern
//! how an attachment comes to exist, and are kept together.

use crate::error::{Phase, classify};
use percent_encoding::percent_decode_str;
use rsfbclient_core::{
    Column, Dialect, FbError, FirebirdClientDbOps, FirebirdClientSqlOps, FreeStmtOp, SqlType, TrOp,
    charset,
};
use rsfbclient_native::{DynLoad, NativeFbAttachmentConfig, NativeFbClient, RemoteConfig};
use sluice_core::redact::redact_url;
use sluice_core::{Error, Result};
use std::path::{Path, PathBuf};
use tokio::sync::oneshot;

type Client = NativeFbClient<DynLoad>;
type DbHandle = <Client as FirebirdClientDbOps>::DbHandle;
type TrHandle = <Client as FirebirdClientSqlOps>::TrHandle;

/// The default port of a Firebird server.
pub const DEFAULT_PORT: u16 = 3050;

/// A parsed Firebird connection target.
#[derive(Clone)]
pub struct FbTarget {
    /// Database file path or alias, as the engine wants it.
    pub database: String,
    /// `Some((host, port))` for a server, `None` for embedded.
    pub server: Option<(String, u16)>,
    user: String,
    password: Option<String>,
    role: Option<String>,
    library: PathBuf,
    display: String,
}

impl std::fmt::Debug for FbTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        f.debug_struct("FbTarget")
            .field("url", &self.display)
            .finish()
    }
}

fn decode(s: &str) -> String {
    percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// The client library the environment names, without loading it: `FBCLIENT`, else
/// `$FIREBIRD/libfbclient.so.2` or `$FIREBIRD/lib/libfbclient.so.2` (the first that exists; the
/// former when neither does); `None` when neither variable is set (the loader's path is then
/// searched, or a URL's `fbclient=` decides). `sluice doctor` uses it to check a run's needs.
pub fn client_library_from_env() -> Option<PathBuf> {
    if let Some(l) = std::env::var_os("FBCLIENT") {
        return Some(PathBuf::from(l));
    }
    let root = PathBuf::from(std::env::var_os("FIREBIRD")?);
    Some(
        [
            root.join("libfbclient.so.2"),
            root.join("lib").join("libfbclient.so.2"),
        ]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| root.join("libfbclient.so.2")),
    )
}

impl FbTarget {
    /// Parse a `firebird://` URL (see the module documentation for the forms).
    pub fn parse(url: &str) -> Result<Self> {
        let display = redact_url(url);
        let bad = |why: String| Error::config(format!("source URL {display} {why}"));
        if !url.starts_with("firebird://") {
            return Err(bad(
                "is not a Firebird URL: it must start with firebird:// (firebird:///abs/path/db.fdb \
                 embedded, or firebird://user@host:3050//abs/path/db.fdb)."
                    .into(),
            ));
        }
        let parsed = url::Url::parse(url).map_err(|e| match e {
            url::ParseError::InvalidPort => {
                bad("has a port that is not a number (firebird://user@host:3050//path).".into())
            }
            e => bad(format!(
                "is not a valid URL ({e}): write firebird:///abs/path/db.fdb (embedded) or \
                 firebird://user@host:3050//abs/path/db.fdb (server)."
            )),
        })?;
        let mut role = None;
        let mut library = None;
        // Parameters are percent-decoded only (`+` is a plus sign in a path or a role name).
        for pair in parsed
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "role" => role = Some(decode(v)),
                "fbclient" => library = Some(PathBuf::from(decode(v))),
                other => {
                    return Err(bad(format!(
                        "has the unknown parameter {other:?}: Firebird URLs take role=NAME and \
                         fbclient=PATH."
                    )));
                }
            }
        }
        let mut user = Some(decode(parsed.username())).filter(|u| !u.is_empty());
        let mut password = parsed.password().map(decode);
        let server = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .map(|h| (h.to_string(), parsed.port().unwrap_or(DEFAULT_PORT)));
        let path = decode(parsed.path());
        let database = match &server {
            // Embedded: the path after firebird:// is absolute.
            None => path,
            // Server: `//abs/path` is an absolute path, `/alias` an alias.
            Some(_) => path.strip_prefix('/').unwrap_or(&path).to_string(),
        };
        if database.trim_matches('/').is_empty() {
            return Err(bad(
                "names no database: write firebird:///abs/path/db.fdb (embedded) or \
                 firebird://user@host:3050//abs/path/db.fdb (server)."
                    .into(),
            ));
        }
        if user.as_deref().is_none_or(str::is_empty) {
            user = Some(std::env::var("ISC_USER").unwrap_or_else(|_| "SYSDBA".into()));
        }
        if password.is_none() {
            password = std::env::var("ISC_PASSWORD").ok();
        }
        let library = match library.or_else(client_library_from_env) {
            Some(l) => l,
            None if server.is_none() => {
                return Err(Error::config(format!(
                    "source URL {display} is an embedded database, which needs an embedded \
                     Firebird runtime: set FIREBIRD to its directory (the one holding \
                     libfbclient.so.2, plugins/ and firebird.conf; e.g. the runtime/ \
                     directory of the firebird-embedded Python wheel) before running \
                     sluice."
                )));
            }
            None => PathBuf::from("libfbclient.so.2"),
        };
        if server.is_none() && std::env::var_os("FIREBIRD").is_none() {
            return Err(Error::config(format!(
                "source URL {display} is an embedded database, but FIREBIRD is not set: the \
                 client library falls back to a server without it. Set FIREBIRD to the \
                 embedded runtime's directory."
            )));
        }
        Ok(FbTarget {
            database,
            server,
            user: user.unwrap_or_default(),
            password,
            role,
            library,
            display,
        })
    }

    /// The URL with the password redacted.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// The client library this target loads.
    pub fn library(&self) -> &Path {
        &self.library
    }

    fn attach_config(&self) -> NativeFbAttachmentConfig {
        NativeFbAttachmentConfig {
            db_name: self.database.clone(),
            user: self.user.clone(),
            role_name: self.role.clone(),
            remote: self.server.as_ref().map(|(host, port)| RemoteConfig {
                host: host.clone(),
                port: *port,
                pass: self.password.clone().unwrap_or_default(),
            }),
        }
    }

    /// Attach on the calling thread (blocking).
    fn attach(&self) -> Result<FbConn> {
        let lib = self.library.to_string_lossy().into_owned();
        let load = || {
            DynLoad {
                charset: charset::UTF_8,
                lib_path: lib.clone(),
            }
            .try_to_client()
            .map_err(|e| classify(e, Phase::Connect, &self.display))
        };
        keep_loaded(&lib, load)?;
        let mut client = load()?;
        let db = client
            .attach_database(&self.attach_config(), Dialect::D3, false)
            .map_err(|e| classify(e, Phase::Connect, &self.display))?;
        Ok(FbConn {
            client,
            db,
            tr: 0,
            library: lib,
            display: self.display.clone(),
        })
    }

    /// Open a session on its own thread, tagged with `tag` (a session context variable the
    /// harm probe looks for).
    pub async fn open(&self, tag: &str) -> Result<Session> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<Job>();
        let me = self.clone();
        let tag = tag.to_string();
        let live = LiveSession::enter();
        let thread = std::thread::Builder::new()
            .name("sluice-firebird".into())
            .spawn(move || {
                let _live = live;
                let opened = me.attach().and_then(|mut conn| {
                    let id = conn.tag_session(&tag)?;
                    Ok((conn, id))
                });
                let mut conn = match opened {
                    Ok((conn, id)) => {
                        let _ = ready_tx.send(Ok(id));
                        conn
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = jobs_rx.recv() {
                    job(&mut conn);
                }
                conn.close();
            })
            .map_err(|e| Error::internal(format!("cannot start a session thread: {e}")))?;
        {
            let mut threads = SESSION_THREADS.lock().unwrap_or_else(|e| e.into_inner());
            // Threads that ended long ago need no join: dropping their handles detaches them.
            threads.retain(|t| !t.is_finished());
            threads.push(thread);
        }
        let id = ready_rx
            .await
            .map_err(|_| Error::internal("the Firebird session thread ended while attaching"))??;
        Ok(Session {
            jobs: jobs_tx,
            attachment: id,
            display: self.display.clone(),
        })
    }
}

/// Session threads that are attached or still detaching: [`shutdown`] waits for them.
static LIVE_SESSIONS: (std::sync::Mutex<usize>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

/// Session threads [`shutdown`] joins before `fb_shutdown`: a thread counted out of
/// [`LIVE_SESSIONS`] has returned from its work but may still be running its thread-local
/// destructors (the client library registers some), and shutting the library down under them
/// is a suspected cause of rare aborts at exit after a completed run.
static SESSION_THREADS: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>> =
    std::sync::Mutex::new(Vec::new());

/// Counts one session thread from before it starts until it has detached and ends.
struct LiveSession;

impl LiveSession {
    fn enter() -> LiveSession {
        *LIVE_SESSIONS.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        LiveSession
    }
}

impl Drop for LiveSession {
    fn drop(&mut self) {
        let mut n = LIVE_SESSIONS.0.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        LIVE_SESSIONS.1.notify_all();
    }
}

/// Libraries loaded (and kept loaded) by this process, by path.
static LOADED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Shut the client library down before the process exits; returns true when one was loaded
/// (the caller should then leave with `_exit`, see below).
///
/// Why: the library shuts itself down from its own static destructors when the process
/// exits, and with an embedded engine that shutdown can deadlock (a destructor waits for an
/// engine thread that waits for it), so a finished export would never exit. This waits up to
/// `wait` for every session thread to detach (dropping a [`Session`] only asks its thread to
/// detach), then calls `fb_shutdown`, which stops the engine's threads and releases its locks
/// on shared database files while everything is still intact. The library's own exit-time
/// shutdown then finds nothing to do, but the caller should still skip the remaining exit
/// handlers (flush its output, then `libc::_exit`), since they belong to a library that has
/// been shut down. Limit: a session stuck in a database call past `wait` is abandoned (the
/// engine's shutdown then cancels it).
pub fn shutdown(wait: std::time::Duration) -> bool {
    let loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if loaded.is_empty() {
        return false;
    }
    let live = LIVE_SESSIONS.0.lock().unwrap_or_else(|e| e.into_inner());
    let (live, _) = LIVE_SESSIONS
        .1
        .wait_timeout_while(live, wait, |n| *n > 0)
        .unwrap_or_else(|e| e.into_inner());
    if *live > 0 {
        tracing::warn!(
            sessions = *live,
            "Firebird sessions still busy at exit; shutting the client library down anyway"
        );
    }
    drop(live);
    join_finished_threads(wait);
    for lib in loaded {
        shutdown_library(&lib, wait);
    }
    true
}

/// Join the session threads that have finished their work (waiting up to `wait` for them to
/// get there), so none is still in its thread-local destructors when the library shuts down.
/// A thread still busy after `wait` is left alone, as [`shutdown`] leaves a live session.
fn join_finished_threads(wait: std::time::Duration) {
    let deadline = std::time::Instant::now() + wait;
    let mut threads =
        std::mem::take(&mut *SESSION_THREADS.lock().unwrap_or_else(|e| e.into_inner()));
    while !threads.is_empty() && std::time::Instant::now() < deadline {
        let (done, busy): (Vec<_>, Vec<_>) = threads.into_iter().partition(|t| t.is_finished());
        for t in done {
            let _ = t.join();
        }
        threads = busy;
        if !threads.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// The client library at `lib` if this process already loaded it (it is never loaded here:
/// `RTLD_NOLOAD`), for its entry points the Rust bindings do not expose.
#[allow(unsafe_code)]
fn already_loaded(lib: &str) -> Option<libloading::os::unix::Library> {
    // SAFETY: with RTLD_NOLOAD, dlopen only returns a new reference to a library this process
    // loaded already; no initialiser runs. The reference is released when the handle drops.
    unsafe {
        libloading::os::unix::Library::open(Some(lib), libc::RTLD_NOW | libc::RTLD_NOLOAD).ok()
    }
}

/// Call `fb_shutdown` of the client library at `lib`, if this process loaded it (the Rust
/// bindings do not expose it, so it is looked up by name). [`shutdown`] uses it for the
/// libraries sessions loaded; a process that loads the library itself (the test kit) calls it
/// directly. Does nothing when the library is not loaded.
#[allow(unsafe_code)]
pub fn shutdown_library(lib: &str, wait: std::time::Duration) {
    /// `fb_shutrsn_app_stopped` of ibase.h.
    const APP_STOPPED: libc::c_int = -3;
    type ShutdownFn = unsafe extern "C" fn(libc::c_uint, libc::c_int) -> libc::c_int;
    let Some(library) = already_loaded(lib) else {
        return;
    };
    // SAFETY: `fb_shutdown` has this C signature in ibase.h; the library stays loaded while
    // `library` lives.
    unsafe {
        if let Ok(f) = library.get::<ShutdownFn>(b"fb_shutdown\0") {
            let millis = libc::c_uint::try_from(wait.as_millis()).unwrap_or(libc::c_uint::MAX);
            if f(millis, APP_STOPPED) != 0 {
                tracing::warn!("the Firebird client library did not shut down cleanly");
            }
        }
    }
}

/// What the server says about an open transaction (`isc_transaction_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionInfo {
    /// The transaction's number (`isc_info_tra_id`).
    pub id: u64,
    /// The oldest interesting transaction as this transaction saw it when it started
    /// (`isc_info_tra_oldest_interesting`): the engine treats every transaction numbered below
    /// it as committed and visible, without looking at its commit number.
    pub oldest: u64,
    /// The snapshot number the transaction reads at (`fb_info_tra_snapshot_number`, Firebird
    /// 4+); `None` where the server does not know the item.
    pub snapshot_number: Option<u64>,
}

/// `isc_transaction_info` of the client library at `lib` for the transaction `tr`.
#[allow(unsafe_code)]
fn transaction_info(lib: &str, tr: &mut TrHandle) -> std::result::Result<TransactionInfo, String> {
    /// Item codes of inf_pub.h.
    const TRA_ID: u8 = 4;
    const TRA_OLDEST_INTERESTING: u8 = 5;
    const TRA_SNAPSHOT_NUMBER: u8 = 12;
    const END: u8 = 1;
    const TRUNCATED: u8 = 2;
    const ERROR: u8 = 3;
    type InfoFn = unsafe extern "C" fn(
        *mut isize,
        *mut TrHandle,
        libc::c_short,
        *const libc::c_char,
        libc::c_short,
        *mut libc::c_char,
    ) -> isize;
    let items = [TRA_ID, TRA_OLDEST_INTERESTING, TRA_SNAPSHOT_NUMBER, END];
    let mut buf = [0u8; 128];
    let mut status = [0isize; 20];
    let library =
        already_loaded(lib).ok_or_else(|| format!("the client library {lib} is not loaded"))?;
    // SAFETY: the library is loaded (and kept loaded, see `keep_loaded`);
    // `isc_transaction_info` has this C signature in ibase.h and writes at most `buf.len()`
    // bytes; `tr` is a live transaction handle of this library.
    unsafe {
        let f = library
            .get::<InfoFn>(b"isc_transaction_info\0")
            .map_err(|_| format!("{lib} has no isc_transaction_info"))?;
        f(
            status.as_mut_ptr(),
            tr,
            items.len() as libc::c_short,
            items.as_ptr().cast(),
            buf.len() as libc::c_short,
            buf.as_mut_ptr().cast(),
        );
    }
    if status[0] == 1 && status[1] != 0 {
        return Err(format!(
            "isc_transaction_info failed with status {}",
            status[1]
        ));
    }
    parse_transaction_info(
        &buf,
        [TRA_ID, TRA_OLDEST_INTERESTING, TRA_SNAPSHOT_NUMBER],
        [END, TRUNCATED, ERROR],
    )
}

/// Parse an information buffer: items `[id, oldest, snapshot]`, markers `[end, truncated, error]`.
fn parse_transaction_info(
    buf: &[u8],
    [id_item, oldest_item, snapshot_item]: [u8; 3],
    [end, truncated, error]: [u8; 3],
) -> std::result::Result<TransactionInfo, String> {
    let (mut id, mut oldest, mut snapshot_number) = (None, None, None);
    let mut at = 0;
    while let Some(&item) = buf.get(at) {
        if item == end {
            break;
        }
        if item == truncated {
            return Err("the transaction information was truncated".into());
        }
        let len = match buf.get(at + 1..at + 3) {
            Some(l) => u16::from_le_bytes([l[0], l[1]]) as usize,
            None => return Err("a transaction information item has no length".into()),
        };
        let value = buf
            .get(at + 3..at + 3 + len)
            .ok_or("a transaction information item is cut short")?;
        at += 3 + len;
        if item == error {
            // The server does not know one of the items (before Firebird 4: the snapshot
            // number); the known ones are still answered.
            continue;
        }
        let mut bytes = [0u8; 8];
        if len > 8 {
            return Err(format!(
                "transaction information item {item} is {len} bytes long"
            ));
        }
        bytes[..len].copy_from_slice(value);
        let v = u64::from_le_bytes(bytes);
        if item == id_item {
            id = Some(v);
        } else if item == oldest_item {
            oldest = Some(v);
        } else if item == snapshot_item {
            snapshot_number = Some(v);
        }
    }
    match (id, oldest) {
        (Some(id), Some(oldest)) => Ok(TransactionInfo {
            id,
            oldest,
            snapshot_number,
        }),
        _ => {
            Err("the server did not report the transaction's number and oldest transaction".into())
        }
    }
}

/// Keep the client library loaded for the rest of the process. Each client handle loads the
/// library and unloads it when dropped; an embedded engine unloaded while its own threads
/// (garbage collector, cache writer) still run makes the process abort. One handle per library
/// path is therefore leaked on first use.
fn keep_loaded(lib: &str, load: impl Fn() -> Result<Client>) -> Result<()> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if !loaded.iter().any(|l| l == lib) {
        std::mem::forget(load()?);
        loaded.push(lib.to_string());
    }
    Ok(())
}

/// A job run on a session's thread.
type Job = Box<dyn FnOnce(&mut FbConn) + Send>;

/// One attachment, owned by its own thread.
pub struct Session {
    jobs: std::sync::mpsc::Sender<Job>,
    attachment: u64,
    display: String,
}

impl Session {
    /// The server's attachment id (`CURRENT_CONNECTION`).
    pub fn attachment_id(&self) -> u64 {
        self.attachment
    }

    /// The redacted URL, for messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// Run `f` on the session's thread and wait for its result.
    pub async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut FbConn) -> R + Send + 'static,
    ) -> Result<R> {
        let (tx, rx) = oneshot::channel();
        self.submit(move |c| {
            let _ = tx.send(f(c));
        })?;
        rx.await.map_err(|_| self.gone())
    }

    /// Queue `f` on the session's thread without waiting (the caller talks to it through
    /// channels it moved into `f`).
    pub fn submit(&self, f: impl FnOnce(&mut FbConn) + Send + 'static) -> Result<()> {
        self.jobs.send(Box::new(f)).map_err(|_| self.gone())
    }

    fn gone(&self) -> Error {
        Error::source_transient(format!(
            "the Firebird session on {} ended unexpectedly",
            self.display
        ))
    }
}

/// An attachment with at most one open transaction, used on its session's thread.
pub struct FbConn {
    client: Client,
    db: DbHandle,
    tr: TrHandle,
    library: String,
    display: String,
}

impl FbConn {
    /// The redacted URL, for messages.
    pub fn display(&self) -> &str {
        &self.display
    }

    /// True while a transaction is open.
    pub fn in_transaction(&self) -> bool {
        self.tr != 0
    }

    /// Start a transaction with a `SET TRANSACTION …` statement (which is how a transaction
    /// joins a snapshot by number: the client starts it with no transaction handle given).
    pub fn begin(&mut self, set_transaction: &str) -> Result<(), FbError> {
        if self.tr != 0 {
            self.commit()?;
        }
        let mut tr: TrHandle = 0;
        self.client
            .exec_immediate(&mut self.db, &mut tr, Dialect::D3, set_transaction)?;
        if tr == 0 {
            return Err(FbError::from(
                "SET TRANSACTION did not start a transaction".to_string(),
            ));
        }
        self.tr = tr;
        Ok(())
    }

    /// Commit the open transaction, if any.
    pub fn commit(&mut self) -> Result<(), FbError> {
        if self.tr != 0 {
            let r = self
                .client
                .transaction_operation(&mut self.tr, TrOp::Commit);
            self.tr = 0;
            r?;
        }
        Ok(())
    }

    /// What the server says about the open transaction (see [`TransactionInfo`]).
    pub fn transaction_info(&mut self) -> Result<TransactionInfo, FbError> {
        if self.tr == 0 {
            return Err(FbError::from("no transaction is open".to_string()));
        }
        transaction_info(&self.library, &mut self.tr).map_err(FbError::from)
    }

    fn ensure_transaction(&mut self) -> Result<(), FbError> {
        if self.tr == 0 {
            self.begin("SET TRANSACTION READ ONLY ISOLATION LEVEL READ COMMITTED")?;
        }
        Ok(())
    }

    /// Run a statement inside the open transaction (one is started if none is).
    pub fn execute(&mut self, sql: &str) -> Result<(), FbError> {
        self.ensure_transaction()?;
        self.client
            .exec_immediate(&mut self.db, &mut self.tr, Dialect::D3, sql)
    }

    /// Run a query and call `row` for each row, stopping early when it returns `false`. A
    /// transaction is started if none is open.
    pub fn for_each_row(
        &mut self,
        sql: &str,
        params: Vec<SqlType>,
        mut row: impl FnMut(Vec<Column>) -> bool,
    ) -> Result<(), FbError> {
        self.ensure_transaction()?;
        let (_, mut stmt) =
            self.client
                .prepare_statement(&mut self.db, &mut self.tr, Dialect::D3, sql)?;
        let run = (|| {
            self.client
                .execute(&mut self.db, &mut self.tr, &mut stmt, params)?;
            while let Some(cols) = self.client.fetch(&mut self.db, &mut self.tr, &mut stmt)? {
                if !row(cols) {
                    break;
                }
            }
            Ok(())
        })();
        let freed = self.client.free_statement(&mut stmt, FreeStmtOp::Drop);
        run.and(freed)
    }

    /// All rows of a query, as values.
    pub fn query(&mut self, sql: &str, params: Vec<SqlType>) -> Result<Vec<Vec<SqlType>>, FbError> {
        let mut out = Vec::new();
        self.for_each_row(sql, params, |cols| {
            out.push(cols.into_iter().map(|c| c.value).collect());
            true
        })?;
        Ok(out)
    }

    fn tag_session(&mut self, tag: &str) -> Result<u64> {
        let display = self.display.clone();
        let rows = self
            .query(
                "SELECT RDB$SET_CONTEXT('USER_SESSION', 'SLUICE_TAG', CAST(? AS VARCHAR(255))), \
                 CURRENT_CONNECTION FROM RDB$DATABASE",
                vec![SqlType::Text(tag.to_string())],
            )
            .and_then(|r| self.commit().map(|_| r))
            .map_err(|e| classify(e, Phase::Connect, &display))?;
        Ok(rows
            .first()
            .and_then(|r| r.get(1))
            .and_then(as_i64)
            .unwrap_or(0) as u64)
    }

    fn close(mut self) {
        if self.tr != 0 {
            let _ = self
                .client
                .transaction_operation(&mut self.tr, TrOp::Rollback);
        }
        let _ = self.client.detach_database(&mut self.db);
    }
}

/// An integer value of a catalog query (integers and numeric text).
pub fn as_i64(v: &SqlType) -> Option<i64> {
    match v {
        SqlType::Integer(i) => Some(*i),
        SqlType::Int128(i) => i64::try_from(*i).ok(),
        SqlType::Floating(f) => Some(*f as i64),
        SqlType::Text(t) => t.trim().parse().ok(),
        _ => None,
    }
}

/// A text value of a catalog query, trimmed (catalog names are CHAR, padded with spaces).
pub fn as_text(v: &SqlType) -> Option<String> {
    match v {
        SqlType::Text(t) => Some(t.trim_end().to_string()),
        SqlType::Integer(i) => Some(i.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls() {
        let t =
            FbTarget::parse("firebird://app:s3cret@db.example:3051//data/shop.fdb?role=R").unwrap();
        assert_eq!(t.database, "/data/shop.fdb");
        assert_eq!(t.server, Some(("db.example".to_string(), 3051)));
        assert_eq!(t.user, "app");
        assert_eq!(t.role.as_deref(), Some("R"));
        assert!(!format!("{t:?}").contains("s3cret"));
        assert!(!t.display().contains("s3cret"));
        let alias = FbTarget::parse("firebird://app@db/employee").unwrap();
        assert_eq!(alias.database, "employee");
        assert_eq!(alias.server, Some(("db".to_string(), DEFAULT_PORT)));
    }

    #[test]
    fn transaction_information_is_parsed_without_unknown_items() {
        let items = [4, 5, 12];
        let marks = [1, 2, 3];
        // id 1234 (4 bytes), oldest 1200 (4 bytes), snapshot number 77 (8 bytes), end.
        let mut buf = vec![4, 4, 0];
        buf.extend(1234u32.to_le_bytes());
        buf.extend([5, 4, 0]);
        buf.extend(1200u32.to_le_bytes());
        buf.extend([12, 8, 0]);
        buf.extend(77u64.to_le_bytes());
        buf.push(1);
        let info = parse_transaction_info(&buf, items, marks).unwrap();
        assert_eq!(
            info,
            TransactionInfo {
                id: 1234,
                oldest: 1200,
                snapshot_number: Some(77)
            }
        );
        // Firebird 3 answers the snapshot-number item with isc_info_error: the item, then
        // isc_infunk (4 bytes).
        let mut old = buf[..14].to_vec();
        old.extend([3, 5, 0, 12]);
        old.extend(1u32.to_le_bytes());
        old.push(1);
        let info = parse_transaction_info(&old, items, marks).unwrap();
        assert_eq!(info.snapshot_number, None);
        assert!(parse_transaction_info(&[2], items, marks).is_err());
        assert!(parse_transaction_info(&[4, 9, 0, 1], items, marks).is_err());
    }

    #[test]
    fn bad_urls_say_how_to_fix() {
        let e = FbTarget::parse("firebird://app:pw@db:port//x.fdb").unwrap_err();
        assert!(e.to_string().contains("not a number"), "{e}");
        let e = FbTarget::parse("firebird://app:pw@db:3050/").unwrap_err();
        assert!(e.to_string().contains("names no database"), "{e}");
        let e = FbTarget::parse("firebird://app@db/x?colour=red").unwrap_err();
        assert!(e.to_string().contains("unknown parameter"), "{e}");
    }
}
