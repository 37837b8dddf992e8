//! File attributes as the kernel wants them, and the extended attributes
//! the mount shows each file's checksums and levels through (Z²FS exposes
//! its checksums to applications; `getfattr -d -m user.intact` reads
//! these).

use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};

use crate::node::{Node, Standing};

/// The kernel's view of `m`, as inode `ino`.
pub fn file_attr(ino: u64, m: &Metadata) -> FileAttr {
    let t = |s: i64, ns: i64| {
        if s >= 0 {
            UNIX_EPOCH + Duration::new(s as u64, ns as u32)
        } else {
            UNIX_EPOCH
        }
    };
    FileAttr {
        ino: INodeNo(ino),
        size: m.size(),
        blocks: m.blocks(),
        atime: t(m.atime(), m.atime_nsec()),
        mtime: t(m.mtime(), m.mtime_nsec()),
        ctime: t(m.ctime(), m.ctime_nsec()),
        crtime: SystemTime::UNIX_EPOCH,
        kind: kind_of(&m.file_type()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

/// The kernel's name for a file type.
pub fn kind_of(t: &std::fs::FileType) -> FileType {
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else if t.is_block_device() {
        FileType::BlockDevice
    } else if t.is_char_device() {
        FileType::CharDevice
    } else if t.is_fifo() {
        FileType::NamedPipe
    } else if t.is_socket() {
        FileType::Socket
    } else {
        FileType::RegularFile
    }
}

/// Prefix of intact's own extended attributes (read-only).
pub const PREFIX: &str = "user.intact.";

/// The extended attributes `node` has, by name, with their values.
pub fn xattrs(node: &Node) -> Vec<(&'static str, Vec<u8>)> {
    let mut out: Vec<(&'static str, Vec<u8>)> = vec![(
        "user.intact.state",
        node.standing.name().as_bytes().to_vec(),
    )];
    let Some(row) = node
        .row
        .as_ref()
        .filter(|_| node.standing == Standing::Cataloged)
    else {
        return out;
    };
    let written = row.mounted_at > 0 || !node.touched.is_empty();
    let level = if written {
        "none"
    } else {
        row.arrival.level.name()
    };
    out.push(("user.intact.level", level.as_bytes().to_vec()));
    let verified = if !node.touched.is_empty() {
        "written through intact mount, not yet recorded (not compared with any source)".to_string()
    } else if row.mounted_at > 0 {
        format!(
            "written through intact mount at {} (not compared with any source; page CRCs from the application's bytes)",
            row.mounted_at
        )
    } else {
        format!(
            "arrived by {} at level {} at {}",
            row.arrival.mode.name(),
            row.arrival.level.name(),
            row.arrival.at
        )
    };
    out.push(("user.intact.verified", verified.into_bytes()));
    out.push((
        "user.intact.page_size",
        node.layout.page.to_string().into_bytes(),
    ));
    if let Some(d) = row.digest.filter(|_| !written) {
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        out.push(("user.intact.blake3", hex.into_bytes()));
    }
    out
}
