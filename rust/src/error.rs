//! Typed errors of the native core.
//!
//! Every error carries the path it is about; the Python glue maps each
//! variant to one exception class (`CacheError(OSError)` and subclasses,
//! `TypeError` for unsupported factor values).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub enum Error {
    /// An operating-system error on `path` while doing `op`.
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A file that does not verify (bad header, version, checksum, JSON).
    Corrupt { path: PathBuf, reason: String },
    /// A lock that could not be taken in time.
    LockTimeout { path: PathBuf, waited_secs: f64 },
    /// A path that is not what the cache needs there (a FIFO, device, socket,
    /// folder or symlink where a regular file must be, a file over the size
    /// cap, a symlink where a folder must be): refused without reading or
    /// following it. `errno` says which (`ELOOP` symlink, `EISDIR` folder,
    /// `EFBIG` too large, `ENXIO` FIFO, socket or device, `ENOTDIR` not a
    /// folder).
    Refused {
        path: PathBuf,
        reason: String,
        errno: i32,
    },
    /// A value that cannot be hashed or stored; `at` is the path inside it.
    Unsupported { at: String, what: String },
    /// An argument of the right type but a wrong value (a key or signature
    /// of the wrong length, no curve point, a malformed signature kind).
    Invalid { what: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn corrupt(path: &Path, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    pub fn invalid(what: impl Into<String>) -> Self {
        Error::Invalid { what: what.into() }
    }

    pub fn refused(path: &Path, errno: i32, reason: impl Into<String>) -> Self {
        Error::Refused {
            path: path.to_path_buf(),
            reason: reason.into(),
            errno,
        }
    }

    /// The OS errno, when there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            Error::Refused { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    pub fn path(&self) -> Option<&Path> {
        match self {
            Error::Io { path, .. }
            | Error::Corrupt { path, .. }
            | Error::LockTimeout { path, .. }
            | Error::Refused { path, .. } => Some(path),
            Error::Unsupported { .. } | Error::Invalid { .. } => None,
        }
    }

    /// A hint for the user on how to fix the problem, if one applies.
    pub fn hint(&self) -> Option<&'static str> {
        if matches!(self, Error::Refused { .. }) {
            return None;
        }
        match self.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => Some(
                "the cache folder is not writable: point cache_dir (FXPIECE_CACHE_ROOT) at a writable folder or use read-only mode",
            ),
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
                Some("the disk is full: free space or prune the cache; nothing was half-written")
            }
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { op, path, source } => {
                write!(f, "cannot {op} {}: {source}", path.display())?;
                if let Some(h) = self.hint() {
                    write!(f, " ({h})")?;
                }
                Ok(())
            }
            Error::Corrupt { path, reason } => {
                write!(f, "corrupt cache index file {}: {reason}", path.display())
            }
            Error::LockTimeout { path, waited_secs } => write!(
                f,
                "timed out after {waited_secs:.1}s waiting for lock {}; if no process holds it, it is freed when its holder exits",
                path.display()
            ),
            Error::Refused { path, reason, .. } => write!(f, "refusing {}: {reason}", path.display()),
            Error::Unsupported { at, what } => write!(f, "unsupported value at {at}: {what}"),
            Error::Invalid { what } => f.write_str(what),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
