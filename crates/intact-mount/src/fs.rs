//! The FUSE file system: the root's tree as it is, every read of a
//! cataloged file checked by its [`Node`], every write keeping its CRCs
//! right, and names kept in step with the catalog.
//!
//! intact's own state directory (`.intact` under the root) is not shown.
//! Hard links are refused (the catalog names a file by one path).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use intact_transfer::{Intent, IntentLog, Journal, Page, STATE_DIR};

use crate::attr::{file_attr, kind_of, xattrs, PREFIX};
use crate::inodes::{Inodes, ROOT};
use crate::node::{mtime_of, Node, NodeError, Standing};
use crate::Stats;

/// How long the kernel may keep names and attributes.
const TTL: Duration = Duration::from_secs(1);

/// Closed files whose CRCs stay in memory (the CRC cache).
const CACHED_NODES: usize = 1024;

type Shared<T> = Arc<RwLock<T>>;

struct Handle {
    file: File,
    node: Shared<Node>,
    /// An error a write through this handle met, owed to the program:
    /// every close reports it until an fsync takes it (Z²FS reports such
    /// errors through fsync).
    owed: Mutex<Option<i32>>,
    /// Whether anything was written through it (its close records the
    /// new CRCs).
    wrote: std::sync::atomic::AtomicBool,
    /// Opened for writing: a bad page any of its requests meets is owed
    /// to its fsync and close too (the kernel may read a page through it
    /// before a partial write, and fail the write itself).
    writable: bool,
}

impl Handle {
    fn owe(&self, e: Errno) {
        lock(&self.owed).get_or_insert(e.code());
    }

    /// The error owed, left owed.
    fn owed(&self) -> Result<(), Errno> {
        match *lock(&self.owed) {
            Some(e) => Err(Errno::from_i32(e)),
            None => Ok(()),
        }
    }

    /// The error owed, now paid.
    fn take_owed(&self) -> Result<(), Errno> {
        match lock(&self.owed).take() {
            Some(e) => Err(Errno::from_i32(e)),
            None => Ok(()),
        }
    }
}

/// The intent log and how many files have CRCs not yet in the catalog
/// (the log is emptied when none has).
struct Log {
    log: IntentLog,
    dirty: usize,
}

pub(crate) struct IntactFs {
    pub(crate) root: PathBuf,
    pub(crate) journal: Arc<Journal>,
    log: Mutex<Log>,
    pub(crate) read_only: bool,
    pub(crate) check: bool,
    inodes: Mutex<Inodes>,
    nodes: Mutex<HashMap<u64, Shared<Node>>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    pub(crate) stats: Arc<Stats>,
    /// Bad pages already reported by this mount (path, offset): a page
    /// the kernel asks for again is counted once.
    reported: Mutex<std::collections::HashSet<(PathBuf, u64)>>,
    /// When each inode's pages first entered the kernel's cache since it
    /// was last invalidated (see `switch.rs`).
    pub(crate) cached: Arc<Mutex<HashMap<u64, Instant>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

impl IntactFs {
    pub(crate) fn new(
        root: PathBuf,
        journal: Arc<Journal>,
        log: IntentLog,
        read_only: bool,
        check: bool,
        stats: Arc<Stats>,
    ) -> IntactFs {
        IntactFs {
            root,
            journal,
            log: Mutex::new(Log { log, dirty: 0 }),
            read_only,
            check,
            inodes: Mutex::new(Inodes::default()),
            nodes: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            stats,
            reported: Mutex::new(std::collections::HashSet::new()),
            cached: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        lock(&self.inodes)
            .path(ino.0)
            .map(Path::to_path_buf)
            .ok_or(Errno::ENOENT)
    }

    /// The path of `name` in directory `parent`; intact's state directory
    /// is not there.
    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        let dir = self.path(parent)?;
        if dir.as_os_str().is_empty() && name == STATE_DIR {
            return Err(Errno::ENOENT);
        }
        if name.as_bytes().contains(&b'/') || name == "." || name == ".." {
            return Err(Errno::EINVAL);
        }
        Ok(dir.join(name))
    }

    fn real(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    fn entry(&self, rel: &Path) -> Result<fuser::FileAttr, Errno> {
        let m = std::fs::symlink_metadata(self.real(rel)).map_err(|e| errno(&e))?;
        let ino = lock(&self.inodes).ino(rel);
        Ok(file_attr(ino, &m))
    }

    fn writable(&self) -> Result<(), Errno> {
        if self.read_only {
            Err(Errno::from_i32(libc::EROFS))
        } else {
            Ok(())
        }
    }

    /// The node of `ino` (open as `file`), from the CRC cache if it still
    /// describes the file, else loaded from the catalog.
    fn node(&self, ino: u64, rel: &Path, file: &File) -> Result<Shared<Node>, Errno> {
        let meta = file.metadata().map_err(|e| errno(&e))?;
        let mut nodes = lock(&self.nodes);
        if let Some(n) = nodes.get(&ino) {
            let g = n.read().unwrap_or_else(|p| p.into_inner());
            let same = g.open > 0
                || !g.touched.is_empty()
                || g.row.as_ref().is_some_and(|r| {
                    g.standing == Standing::Cataloged
                        && (meta.len(), mtime_of(&meta)) == (r.size, r.mtime)
                });
            if same {
                drop(g);
                return Ok(Arc::clone(n));
            }
        }
        let node = if self.check {
            let row = self.journal.mount_row(bytes(rel)).map_err(|_| Errno::EIO)?;
            Node::load(&self.journal, row, file).map_err(|e| self.fail(rel, e, "read"))?
        } else {
            Node::unchecked(None, Standing::Uncataloged, meta.len())
        };
        if nodes.len() >= CACHED_NODES {
            let idle: Vec<u64> = nodes
                .iter()
                .filter(|(_, n)| {
                    n.try_read()
                        .is_ok_and(|g| g.open == 0 && g.touched.is_empty())
                })
                .map(|(i, _)| *i)
                .take(CACHED_NODES / 4)
                .collect();
            for i in idle {
                nodes.remove(&i);
            }
        }
        let n = Arc::new(RwLock::new(node));
        nodes.insert(ino, Arc::clone(&n));
        Ok(n)
    }

    /// The errno for a node's failure; bad pages are logged, counted and
    /// recorded in the catalog for `intact status`, as found by `kind`
    /// ("read", "write": a partly covered page read before a write,
    /// "commit": a page read back at fsync or close).
    fn fail(&self, rel: &Path, e: NodeError, kind: &str) -> Errno {
        match e {
            NodeError::Io(e) => errno(&e),
            NodeError::Catalog(e) => {
                eprintln!("intact mount: {}: catalog: {e}", rel.display());
                Errno::EIO
            }
            NodeError::Bad(pages) => {
                self.bad(rel, &pages, kind);
                Errno::EIO
            }
            NodeError::TooBig => {
                eprintln!(
                    "intact mount: {}: refused a change growing it by over {} GiB at once (EFBIG)",
                    rel.display(),
                    crate::node::MAX_GROWTH >> 30
                );
                Errno::from_i32(libc::EFBIG)
            }
        }
    }

    fn bad(&self, rel: &Path, pages: &[Page], kind: &str) {
        for p in pages {
            if !lock(&self.reported).insert((rel.to_path_buf(), p.offset)) {
                continue;
            }
            eprintln!(
                "intact mount: {}: bytes {}..{} (block {}, page {}) do not match their page CRC (found by a {kind}): refused with EIO",
                rel.display(),
                p.offset,
                p.offset + p.len,
                p.block,
                p.index
            );
            if let Err(e) = self
                .journal
                .record_mount_error(bytes(rel), p.offset, p.len, kind)
            {
                eprintln!("intact mount: catalog: {e}");
            }
            self.stats.bad_pages.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Appends `intents` to the log; the first append of a file with no
    /// CRCs outside the catalog counts it, under the same lock, so that
    /// the log is never emptied while its bytes are on their way.
    fn append(&self, intents: &[Intent], counted: &mut bool) -> std::io::Result<()> {
        let mut log = lock(&self.log);
        log.log.append(intents)?;
        if !*counted {
            log.dirty += 1;
            *counted = true;
        }
        Ok(())
    }

    /// Once `node` has no CRCs outside the catalog, it no longer counts;
    /// the log is emptied when no file does.
    fn settle(&self, node: &mut Node) {
        if !node.counted || !node.touched.is_empty() {
            return;
        }
        node.counted = false;
        let mut log = lock(&self.log);
        log.dirty = log.dirty.saturating_sub(1);
        if log.dirty == 0 {
            if let Err(e) = log.log.clear() {
                eprintln!("intact mount: emptying the intent log: {e}");
            }
        }
    }

    /// Records `node`'s new CRCs in the catalog; pages that no longer
    /// hold what was written are logged and fail the call.
    fn commit(&self, rel: &Path, node: &mut Node, file: &File) -> Result<(), Errno> {
        if node.touched.is_empty() {
            self.settle(node);
            return Ok(());
        }
        let r = node.commit(file, &self.journal);
        self.settle(node);
        match r {
            Ok((_, bad)) if bad.is_empty() => Ok(()),
            Ok((_, bad)) => {
                self.bad(rel, &bad, "commit");
                Err(Errno::EIO)
            }
            Err(e) => Err(self.fail(rel, e, "commit")),
        }
    }

    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        lock(&self.handles).get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn open_file(&self, rel: &Path, write: bool) -> Result<File, Errno> {
        OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.real(rel))
            .map_err(|e| errno(&e))
    }

    fn add_handle(&self, file: File, node: Shared<Node>, writable: bool) -> u64 {
        node.write().unwrap_or_else(|p| p.into_inner()).open += 1;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(
            fh,
            Arc::new(Handle {
                file,
                node,
                owed: Mutex::new(None),
                wrote: false.into(),
                writable,
            }),
        );
        fh
    }

    /// Hands a new file or directory to the user who asked for it (a
    /// mount run by root serves other users with `allow_other`).
    fn give(&self, req: &Request, path: &Path) {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if me == 0 && req.uid() != 0 {
            let _ = std::os::unix::fs::lchown(path, Some(req.uid()), Some(req.gid()));
        }
    }

    /// Forgets the node of a name that went (unlinked or replaced).
    fn drop_node(&self, ino: Option<u64>) {
        let Some(n) = ino.and_then(|i| lock(&self.nodes).remove(&i)) else {
            return;
        };
        let mut g = n.write().unwrap_or_else(|p| p.into_inner());
        g.touched.clear();
        g.row = None;
        g.standing = Standing::Uncataloged;
        self.settle(&mut g);
    }

    fn mark_cached(&self, ino: u64) {
        lock(&self.cached).entry(ino).or_insert_with(Instant::now);
    }

    /// Commits every file with CRCs not yet in the catalog (at unmount).
    pub(crate) fn commit_all(&self) {
        let dirty: Vec<(u64, Shared<Node>)> = lock(&self.nodes)
            .iter()
            .map(|(i, n)| (*i, Arc::clone(n)))
            .collect();
        for (ino, n) in dirty {
            let mut g = n.write().unwrap_or_else(|p| p.into_inner());
            if g.touched.is_empty() {
                continue;
            }
            let Ok(rel) = self.path(INodeNo(ino)) else {
                continue;
            };
            match self.open_file(&rel, false) {
                Ok(f) => {
                    let _ = self.commit(&rel, &mut g, &f);
                }
                Err(e) => eprintln!(
                    "intact mount: {}: cannot record its CRCs at unmount ({e:?}); the intent log keeps them",
                    rel.display()
                ),
            }
        }
    }
}

impl Filesystem for IntactFs {
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn destroy(&mut self) {
        self.commit_all();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|rel| self.entry(&rel)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        if let Some(h) = fh.and_then(|fh| self.handle(fh).ok()) {
            return match h.file.metadata() {
                Ok(m) => reply.attr(&TTL, &file_attr(ino.0, &m)),
                Err(e) => reply.error(errno(&e)),
            };
        }
        match self.path(ino).and_then(|rel| self.entry(&rel)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = (|| -> Result<fuser::FileAttr, Errno> {
            let rel = self.path(ino)?;
            let real = self.real(&rel);
            if mode.is_some() || uid.is_some() || gid.is_some() || size.is_some() {
                self.writable()?;
            }
            if let Some(size) = size {
                let h = fh.and_then(|fh| self.handle(fh).ok());
                let file = match &h {
                    Some(h) => h.file.try_clone().map_err(|e| errno(&e))?,
                    None => self.open_file(&rel, true)?,
                };
                let node = match &h {
                    Some(h) => Arc::clone(&h.node),
                    None => self.node(ino.0, &rel, &file)?,
                };
                let mut g = node.write().unwrap_or_else(|p| p.into_inner());
                let mut counted = g.counted;
                let r = g.truncate(&file, size, &mut |i| self.append(i, &mut counted));
                g.counted = counted;
                if let Err(e) = r {
                    self.settle(&mut g);
                    let e = self.fail(&rel, e, "write");
                    if let Some(h) = &h {
                        h.owe(e);
                    }
                    return Err(e);
                }
                match &h {
                    Some(h) => h.wrote.store(true, Ordering::Relaxed),
                    None => self.commit(&rel, &mut g, &file)?,
                }
            }
            if let Some(mode) = mode {
                std::fs::set_permissions(&real, std::fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(|e| errno(&e))?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(&real, uid, gid).map_err(|e| errno(&e))?;
            }
            if atime.is_some() || mtime.is_some() {
                self.writable()?;
                let before = std::fs::symlink_metadata(&real).map_err(|e| errno(&e))?;
                set_times(&real, atime, mtime)?;
                self.times_changed(ino.0, &rel, &before)?;
            }
            self.entry(&rel)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self
            .path(ino)
            .and_then(|rel| std::fs::read_link(self.real(&rel)).map_err(|e| errno(&e)))
        {
            Ok(t) => reply.data(t.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = (|| {
            self.writable()?;
            let rel = self.child(parent, name)?;
            let real = self.real(&rel);
            std::fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(&real)
                .map_err(|e| errno(&e))?;
            self.give(req, &real);
            self.entry(&rel)
        })();
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = (|| {
            self.writable()?;
            let rel = self.child(parent, name)?;
            std::fs::remove_file(self.real(&rel)).map_err(|e| errno(&e))?;
            if let Err(e) = self.journal.forget_path(bytes(&rel)) {
                eprintln!("intact mount: {}: catalog: {e}", rel.display());
            }
            let ino = lock(&self.inodes).remove(&rel);
            self.drop_node(ino);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = (|| {
            self.writable()?;
            let rel = self.child(parent, name)?;
            std::fs::remove_dir(self.real(&rel)).map_err(|e| errno(&e))?;
            lock(&self.inodes).remove(&rel);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = (|| {
            self.writable()?;
            let rel = self.child(parent, link_name)?;
            let real = self.real(&rel);
            std::os::unix::fs::symlink(target, &real).map_err(|e| errno(&e))?;
            self.give(req, &real);
            self.entry(&rel)
        })();
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            self.writable()?;
            let from = self.child(parent, name)?;
            let to = self.child(newparent, newname)?;
            let how = if flags.is_empty() {
                rustix::fs::RenameFlags::empty()
            } else if flags == RenameFlags::RENAME_NOREPLACE {
                rustix::fs::RenameFlags::NOREPLACE
            } else {
                // Exchanging two names would swap their catalog rows too;
                // not supported.
                return Err(Errno::EINVAL);
            };
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                self.real(&from),
                rustix::fs::CWD,
                self.real(&to),
                how,
            )
            .map_err(|e| Errno::from_i32(e.raw_os_error()))?;
            if let Err(e) = self.journal.rename_path(bytes(&from), bytes(&to)) {
                eprintln!(
                    "intact mount: renaming {} to {} in the catalog: {e}",
                    from.display(),
                    to.display()
                );
            }
            let replaced = lock(&self.inodes).rename(&from, &to);
            self.drop_node(replaced);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // The catalog names a file by one path.
        reply.error(Errno::EPERM);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = (|| {
            let rel = self.path(ino)?;
            let write = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
            if write {
                self.writable()?;
            }
            let file = self.open_file(&rel, write)?;
            let node = self.node(ino.0, &rel, &file)?;
            Ok(self.add_handle(file, node, write))
        })();
        // O_DIRECT: every read and write reaches the mount as the program
        // made it (unaligned ones too), past the kernel's cache.
        let how = if flags.0 & libc::O_DIRECT != 0 {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
        };
        match r {
            Ok(fh) => reply.opened(FileHandle(fh), how),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = (|| {
            self.writable()?;
            let rel = self.child(parent, name)?;
            let real = self.real(&rel);
            let existed = std::fs::symlink_metadata(&real).is_ok();
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(mode & !umask & 0o7777)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | (flags & libc::O_EXCL))
                .open(&real)
                .map_err(|e| errno(&e))?;
            let ino = lock(&self.inodes).ino(&rel);
            let node = if existed {
                self.node(ino, &rel, &file)?
            } else {
                self.give(req, &real);
                let node = if self.check {
                    let m = file.metadata().map_err(|e| errno(&e))?;
                    let id = self
                        .journal
                        .mount_create(
                            bytes(&rel),
                            intact_digest::defaults::BLOCK_BYTES as u32,
                            mtime_of(&m),
                        )
                        .map_err(|e| self.fail(&rel, NodeError::Catalog(e), "write"))?;
                    let row = self
                        .journal
                        .mount_row_by_id(id)
                        .ok()
                        .flatten()
                        .ok_or(Errno::EIO)?;
                    Node::created(row, self.journal.page_size() as u64)
                } else {
                    Node::unchecked(None, Standing::Uncataloged, 0)
                };
                let n = Arc::new(RwLock::new(node));
                lock(&self.nodes).insert(ino, Arc::clone(&n));
                n
            };
            let m = file.metadata().map_err(|e| errno(&e))?;
            let fh = self.add_handle(file, node, true);
            Ok((file_attr(ino, &m), fh))
        })();
        match r {
            Ok((a, fh)) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let r = (|| {
            let h = self.handle(fh)?;
            let g = h.node.read().unwrap_or_else(|p| p.into_inner());
            let checked = g.checked();
            match g.read(&h.file, offset, size) {
                Ok(data) => {
                    let s = &self.stats;
                    if checked {
                        s.bytes_checked
                            .fetch_add(data.len() as u64, Ordering::Relaxed);
                    } else {
                        s.bytes_unchecked
                            .fetch_add(data.len() as u64, Ordering::Relaxed);
                    }
                    Ok(data)
                }
                Err(e) => {
                    drop(g);
                    let e = self.fail(&self.path(ino).unwrap_or_default(), e, "read");
                    if h.writable {
                        h.owe(e);
                    }
                    Err(e)
                }
            }
        })();
        match r {
            Ok(data) => {
                self.mark_cached(ino.0);
                reply.data(&data)
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = (|| {
            self.writable()?;
            let h = self.handle(fh)?;
            let mut g = h.node.write().unwrap_or_else(|p| p.into_inner());
            let mut counted = g.counted;
            let r = g.write(&h.file, offset, data, &mut |i| self.append(i, &mut counted));
            g.counted = counted;
            h.wrote.store(true, Ordering::Relaxed);
            match r {
                Ok(()) => {
                    self.stats
                        .bytes_written
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                    Ok(())
                }
                Err(e) => {
                    self.settle(&mut g);
                    let e = self.fail(&self.path(ino).unwrap_or_default(), e, "write");
                    // Owed to the program at fsync and close too, in case
                    // it did not look at this write's result.
                    h.owe(e);
                    Err(e)
                }
            }
        })();
        match r {
            Ok(()) => {
                self.mark_cached(ino.0);
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A close: what was written through this handle goes into the
        // catalog now, so that an error doing so reaches close(2).
        let r = (|| {
            let h = self.handle(fh)?;
            let committed = if h.wrote.swap(false, Ordering::Relaxed) {
                let mut g = h.node.write().unwrap_or_else(|p| p.into_inner());
                self.commit(&self.path(ino)?, &mut g, &h.file)
            } else {
                Ok(())
            };
            // Told, not taken: a flush comes at every close of a
            // descriptor of this open file, a forked child's too, so the
            // program's own fsync or close must still get it (as Linux's
            // own write-back errors: every close reports, fsync consumes).
            let owed = h.owed();
            committed.and(owed)
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let h = lock(&self.handles).remove(&fh.0);
        if let Some(h) = h {
            let mut g = h.node.write().unwrap_or_else(|p| p.into_inner());
            g.open = g.open.saturating_sub(1);
            if g.open == 0 && !g.touched.is_empty() {
                // Written after the last close (through a mapping): no one
                // to tell of an error but the log.
                let rel = self.path(ino).unwrap_or_default();
                if let Err(e) = self.commit(&rel, &mut g, &h.file) {
                    eprintln!(
                        "intact mount: {}: recording its CRCs at release: {e:?}",
                        rel.display()
                    );
                }
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = (|| {
            let h = self.handle(fh)?;
            let mut g = h.node.write().unwrap_or_else(|p| p.into_inner());
            let synced = if datasync {
                h.file.sync_data()
            } else {
                h.file.sync_all()
            };
            synced.map_err(|e| errno(&e))?;
            let rel = self.path(ino)?;
            let committed = self.commit(&rel, &mut g, &h.file);
            let owed = h.take_owed();
            committed.and(owed)
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = (|| {
            let rel = self.path(ino)?;
            let mut entries: Vec<(u64, FileType, std::ffi::OsString)> = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ROOT, FileType::Directory, "..".into()),
            ];
            for e in std::fs::read_dir(self.real(&rel)).map_err(|e| errno(&e))? {
                let e = e.map_err(|e| errno(&e))?;
                let name = e.file_name();
                if rel.as_os_str().is_empty() && name == STATE_DIR {
                    continue;
                }
                let kind = e
                    .file_type()
                    .map(|t| kind_of(&t))
                    .unwrap_or(FileType::RegularFile);
                let i = lock(&self.inodes).ino(&rel.join(&name));
                entries.push((i, kind, name));
            }
            Ok(entries)
        })();
        match r {
            Ok(entries) => {
                for (n, (i, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(i), n as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match rustix::fs::statvfs(&self.root) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(Errno::from_i32(e.raw_os_error())),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.xattr_list(ino).map(|list| {
            list.into_iter()
                .find(|(n, _)| OsStr::new(n) == name)
                .map(|(_, v)| v)
        }) {
            Ok(Some(v)) => reply_xattr(reply, size, &v),
            Ok(None) => reply.error(Errno::from_i32(libc::ENODATA)),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.xattr_list(ino) {
            Ok(list) => {
                let mut names = Vec::new();
                for (n, _) in list {
                    names.extend_from_slice(n.as_bytes());
                    names.push(0);
                }
                reply_xattr(reply, size, &names)
            }
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(xattr_refusal(name));
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply.error(xattr_refusal(name));
    }
}

/// intact's own attributes are its to set; others are not kept.
fn xattr_refusal(name: &OsStr) -> Errno {
    if name.as_bytes().starts_with(PREFIX.as_bytes()) {
        Errno::EPERM
    } else {
        Errno::from_i32(libc::ENOTSUP)
    }
}

fn reply_xattr(reply: ReplyXattr, size: u32, v: &[u8]) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if (size as usize) < v.len() {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(v);
    }
}

impl IntactFs {
    /// intact's extended attributes of `ino` (none for a directory or a
    /// link).
    fn xattr_list(&self, ino: INodeNo) -> Result<Vec<(&'static str, Vec<u8>)>, Errno> {
        let rel = self.path(ino)?;
        let m = std::fs::symlink_metadata(self.real(&rel)).map_err(|e| errno(&e))?;
        if !m.is_file() {
            return Ok(Vec::new());
        }
        let file = self.open_file(&rel, false)?;
        let node = self.node(ino.0, &rel, &file)?;
        let g = node.read().unwrap_or_else(|p| p.into_inner());
        Ok(xattrs(&g))
    }

    /// After an application set a file's times (`touch`, `cp -p`): if
    /// the catalog described the file just before (`before`: its size and
    /// mtime then), the bytes did not change, so the catalog takes the
    /// new mtime. A file changed by another program stays changed.
    fn times_changed(&self, ino: u64, rel: &Path, before: &Metadata) -> Result<(), Errno> {
        if !self.check || !before.is_file() {
            return Ok(());
        }
        let was = (before.len(), mtime_of(before));
        let m = std::fs::symlink_metadata(self.real(rel)).map_err(|e| errno(&e))?;
        let Some(n) = lock(&self.nodes).get(&ino).cloned() else {
            if let Ok(Some(row)) = self.journal.mount_row(bytes(rel)) {
                if row.done && (row.size, row.mtime) == was {
                    if let Err(e) = self.journal.set_mtime(row.id, mtime_of(&m)) {
                        eprintln!("intact mount: {}: catalog: {e}", rel.display());
                    }
                }
            }
            return Ok(());
        };
        let mut g = n.write().unwrap_or_else(|p| p.into_inner());
        let writing = !g.touched.is_empty();
        if g.standing != Standing::Cataloged {
            return Ok(());
        }
        if let Some(r) = g.row.as_mut() {
            if writing || (r.size, r.mtime) == was {
                r.mtime = mtime_of(&m);
                if let Err(e) = self.journal.set_mtime(r.id, r.mtime) {
                    eprintln!("intact mount: {}: catalog: {e}", rel.display());
                }
            }
        }
        Ok(())
    }
}

fn set_times(path: &Path, atime: Option<TimeOrNow>, mtime: Option<TimeOrNow>) -> Result<(), Errno> {
    use rustix::fs::{AtFlags, Timespec, Timestamps, UTIME_NOW, UTIME_OMIT};
    let ts = |t: Option<TimeOrNow>| match t {
        None => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => {
            let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: i64::from(d.subsec_nanos()),
            }
        }
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &Timestamps {
            last_access: ts(atime),
            last_modification: ts(mtime),
        },
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| Errno::from_i32(e.raw_os_error()))
}
