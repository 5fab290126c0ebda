//! Network namespaces: named ones under `/var/run/netns` (like `ip netns add/del`), and the per-namespace worker
//! thread that owns a netlink socket opened inside the namespace.
//!
//! Nothing here forks, and `setns`/`unshare` only ever run on threads this module spawns and owns, never on a tokio
//! worker: a thread that changed namespace is never handed back to a pool.

use std::fs::{self, File, OpenOptions};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};

/// Where `ip netns` keeps named namespaces.
pub const NETNS_RUN_DIR: &str = "/var/run/netns";

/// Checks a namespace name as `ip netns add` does: not empty, not `.`/`..`, no `/`, at most 255 bytes.
pub fn validate_netns_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\0')
        || name.len() > 255
    {
        return Err(Error::InvalidNetnsName {
            name: name.to_string(),
        });
    }
    Ok(())
}

fn io_err(op: &'static str, target: &Path, netns: &str, e: impl Into<io::Error>) -> Error {
    Error::io(op, target.display().to_string(), netns, e.into())
}

/// Makes `dir` a shared mount point (like `ip netns add`), so that namespace mounts under it propagate to mount
/// namespaces created later (containers started after the pod sandbox).
fn make_shared_mount(dir: &Path) -> Result<()> {
    let shared = || {
        mount(
            None::<&str>,
            dir,
            None::<&str>,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
    };
    match shared() {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL) => {
            // Not a mount point yet: bind it onto itself, then share it.
            mount(
                Some(dir),
                dir,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .map_err(|e| io_err("bind-mount", dir, "-", e))?;
            shared().map_err(|e| io_err("make shared", dir, "-", e))
        }
        Err(e) => Err(io_err("make shared", dir, "-", e)),
    }
}

/// Whether `path` is a bind mount of a namespace (nsfs), that is, a live named namespace.
fn is_netns_mount(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .map(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
        .unwrap_or(false)
}

/// Creates the named network namespace `dir/name` (`ip netns add NAME` when `dir` is [`NETNS_RUN_DIR`]) and
/// returns its path. Idempotent: a namespace already mounted there is success.
///
/// A dedicated thread `unshare`s a new network namespace and bind-mounts `/proc/thread-self/ns/net` onto the file,
/// then exits; the mount keeps the namespace alive. The new namespace has only `lo`, down.
pub fn create_named_netns(dir: &Path, name: &str) -> Result<PathBuf> {
    validate_netns_name(name)?;
    let path = dir.join(name);
    fs::create_dir_all(dir).map_err(|e| io_err("create directory", dir, name, e))?;
    make_shared_mount(dir)?;
    if is_netns_mount(&path) {
        return Ok(path);
    }
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| io_err("create mount point", &path, name, e))?;
    let target = path.clone();
    let label = name.to_string();
    let res = std::thread::Builder::new()
        .name("netns-add".into())
        .spawn(move || -> Result<()> {
            unshare(CloneFlags::CLONE_NEWNET)
                .map_err(|e| io_err("unshare(CLONE_NEWNET)", &target, &label, e))?;
            let src = Path::new("/proc/thread-self/ns/net");
            mount(
                Some(src),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| io_err("bind-mount netns", &target, &label, e))
        })
        .map_err(|e| io_err("spawn thread", &path, name, e))?
        .join()
        .unwrap_or_else(|_| {
            Err(Error::WorkerGone {
                netns: name.to_string(),
            })
        });
    if let Err(e) = res {
        let _ = fs::remove_file(&path);
        return Err(e);
    }
    Ok(path)
}

/// Deletes the named network namespace `dir/name` (`ip netns del NAME`): lazy unmount, then unlink. Idempotent: an
/// absent namespace is success. The namespace itself lives on while a process or socket still holds it.
pub fn delete_named_netns(dir: &Path, name: &str) -> Result<()> {
    validate_netns_name(name)?;
    let path = dir.join(name);
    match umount2(&path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(io_err("unmount", &path, name, e)),
    }
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove", &path, name, e)),
    }
}

/// What a job gets on the worker thread: the rtnetlink handle (socket bound to the namespace) and a label for errors.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) handle: rtnetlink::Handle,
    pub(crate) netns: Arc<str>,
}

type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;
/// A job gets the context, or the error that kept the thread from entering its namespace.
type Job = Box<dyn FnOnce(Result<Ctx>) -> LocalFuture + Send>;

/// Runs `f` with the calling worker thread inside the namespace `target`, then moves the thread back to the
/// namespace it was in. For short synchronous work only (a sysctl, opening a socket): nothing else runs on the
/// thread meanwhile, since `f` cannot await.
pub(crate) fn in_netns<T>(target: &File, label: &str, f: impl FnOnce() -> T) -> Result<T> {
    let own = File::open("/proc/thread-self/ns/net").map_err(|e| {
        io_err(
            "open netns",
            Path::new("/proc/thread-self/ns/net"),
            label,
            e,
        )
    })?;
    setns(target, CloneFlags::CLONE_NEWNET)
        .map_err(|e| io_err("setns", Path::new(label), label, io::Error::from(e)))?;
    let out = f();
    // Back before anything else runs here: the worker's later sysctls resolve against this thread's namespace.
    setns(&own, CloneFlags::CLONE_NEWNET).map_err(|e| {
        io_err(
            "setns back",
            Path::new("/proc/thread-self/ns/net"),
            label,
            io::Error::from(e),
        )
    })?;
    Ok(out)
}

/// Why a worker could not start, kept to answer every job with it.
struct StartFailure {
    op: &'static str,
    target: String,
    errno: Option<i32>,
    kind: io::ErrorKind,
    message: String,
}

impl StartFailure {
    fn new(op: &'static str, target: String, e: io::Error) -> Self {
        StartFailure {
            op,
            target,
            errno: e.raw_os_error(),
            kind: e.kind(),
            message: e.to_string(),
        }
    }

    fn error(&self, netns: &str) -> Error {
        let source = match self.errno {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(self.kind, self.message.clone()),
        };
        Error::io(self.op, self.target.clone(), netns, source)
    }
}

/// A thread inside one network namespace, running a current-thread runtime with the netlink connection, serving
/// jobs one at a time from a channel. It stops when the last [`Worker`] clone is dropped.
#[derive(Clone)]
pub(crate) struct Worker {
    tx: mpsc::UnboundedSender<Job>,
    netns: Arc<str>,
}

impl Worker {
    /// Starts a worker in the namespace at `path`, or in the caller's namespace when `path` is `None`, and
    /// returns at once: jobs queue while the thread enters the namespace and opens its socket, and if that
    /// fails each job gets the failure. A pod's ADD thus overlaps the thread's start with other work instead
    /// of blocking a runtime worker on it. Opening the namespace file is checked here.
    pub(crate) fn spawn(path: Option<&Path>) -> Result<Self> {
        let netns: Arc<str> = match path {
            Some(p) => p.display().to_string().into(),
            None => "current".into(),
        };
        let fd = match path {
            Some(p) => Some(File::open(p).map_err(|e| io_err("open netns", p, &netns, e))?),
            None => None,
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        let label = netns.clone();
        std::thread::Builder::new()
            .name("netns-netlink".into())
            .spawn(move || {
                let start =
                    || -> std::result::Result<(tokio::runtime::Runtime, Ctx), StartFailure> {
                        if let Some(fd) = fd {
                            setns(&fd, CloneFlags::CLONE_NEWNET).map_err(|e| {
                                StartFailure::new("setns", label.to_string(), e.into())
                            })?;
                        }
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_io()
                            .build()
                            .map_err(|e| StartFailure::new("build runtime", String::new(), e))?;
                        // The socket is created here, after setns: it stays bound to this namespace.
                        let (conn, handle, _) = {
                            let _guard = rt.enter();
                            rtnetlink::new_connection_with_socket::<netlink_sys::TokioSocket>()
                                .map_err(|e| {
                                    StartFailure::new("open netlink socket", String::new(), e)
                                })?
                        };
                        rt.spawn(conn);
                        Ok((
                            rt,
                            Ctx {
                                handle,
                                netns: label.clone(),
                            },
                        ))
                    };
                match start() {
                    Ok((rt, ctx)) => rt.block_on(async move {
                        while let Some(job) = rx.recv().await {
                            job(Ok(ctx.clone())).await;
                        }
                    }),
                    Err(failure) => {
                        // No runtime here: given an error, a job's future finishes at its first poll.
                        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                        while let Some(job) = rx.blocking_recv() {
                            let _ = job(Err(failure.error(&label))).as_mut().poll(&mut cx);
                        }
                    }
                }
            })
            .map_err(|e| io_err("spawn thread", Path::new(&*netns), &netns, e))?;
        Ok(Worker { tx, netns })
    }

    /// Like [`Worker::spawn`], then waits until the thread is in its namespace with its socket open, so a
    /// failure to start is this call's error (for long-lived handles such as the node's own namespace).
    pub(crate) fn spawn_ready(path: Option<&Path>) -> Result<Self> {
        let w = Self::spawn(path)?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<()>>(1);
        let job: Job = Box::new(move |ctx| {
            Box::pin(async move {
                let _ = tx.send(ctx.map(|_| ()));
            })
        });
        w.tx.send(job).map_err(|_| w.gone())?;
        rx.recv().map_err(|_| w.gone())??;
        Ok(w)
    }

    fn gone(&self) -> Error {
        Error::WorkerGone {
            netns: self.netns.to_string(),
        }
    }

    /// The namespace's label for errors (its path, or `current`).
    pub(crate) fn netns(&self) -> &str {
        &self.netns
    }

    /// Runs `f` on the worker thread and returns its result. `f`'s future need not be `Send`: it never leaves the
    /// thread.
    pub(crate) async fn call<R, F, Fut>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(Ctx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<R>> + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |ctx| {
            Box::pin(async move {
                let _ = tx.send(match ctx {
                    Ok(ctx) => f(ctx).await,
                    Err(e) => Err(e),
                });
            })
        });
        self.tx.send(job).map_err(|_| self.gone())?;
        rx.await.map_err(|_| self.gone())?
    }
}
