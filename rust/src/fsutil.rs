//! File-system building blocks of the cache: atomic writes, folder fsync,
//! `flock`ed sidecar files, private folders, a reader that is safe on
//! hostile input, and moving bad files aside without overwriting anything.
//!
//! Everything under the cache root may have been put there by someone else
//! (another tool, a confused user, an attacker with write access to a shared
//! folder). [`read_regular_file`] therefore never follows a symlink, never
//! opens anything but a regular file (a FIFO would block forever, a device
//! could be endless or have side effects on open) and never reads more than
//! a cap.

use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::proc;

/// Default cap on the size of a file the cache reads: far above any real
/// index file (a 100,000-entry snapshot is a few tens of MiB).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 << 20;

/// What kind of thing a file-system entry is, in words.
pub fn describe(m: &Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// Refuse anything but a regular file, by the `lstat` (or `fstat`) of it.
fn refuse_unless_regular(path: &Path, m: &Metadata) -> Result<()> {
    let t = m.file_type();
    if t.is_file() {
        return Ok(());
    }
    let errno = if t.is_symlink() {
        libc::ELOOP
    } else if t.is_dir() {
        libc::EISDIR
    } else {
        libc::ENXIO
    };
    Err(Error::refused(
        path,
        errno,
        format!("{} is not a regular file; not read, not followed", describe(m)),
    ))
}

fn refuse_if_over(path: &Path, size: u64, max_bytes: u64) -> Result<()> {
    if size > max_bytes {
        return Err(Error::refused(
            path,
            libc::EFBIG,
            format!("{size} bytes is over the {max_bytes}-byte cap; not read"),
        ));
    }
    Ok(())
}

/// Read a whole regular file of at most `max_bytes`, safely on hostile input:
/// a symlink (dangling or not), folder, FIFO, socket or device is refused
/// (`Error::Refused`) without being opened or followed; the file is opened
/// `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC` and `fstat`ed again (so a swap
/// between the check and the open is refused too); a file over the cap is
/// refused before reading, and reading stops at the cap if it grows. A file
/// that does not exist is an `Error::Io` with `ENOENT`.
pub fn read_regular_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    let before = fs::symlink_metadata(path).map_err(|e| Error::io("read", path, e))?;
    refuse_unless_regular(path, &before)?;
    refuse_if_over(path, before.len(), max_bytes)?;
    let mut file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Error::refused(
                path,
                libc::ELOOP,
                "a symbolic link is not a regular file; not read, not followed",
            ))
        }
        Err(e) => return Err(Error::io("read", path, e)),
    };
    let m = file.metadata().map_err(|e| Error::io("stat", path, e))?;
    refuse_unless_regular(path, &m)?;
    if (m.dev(), m.ino()) != (before.dev(), before.ino()) {
        return Err(Error::io(
            "read",
            path,
            std::io::Error::new(ErrorKind::NotFound, "replaced while being opened"),
        ));
    }
    refuse_if_over(path, m.len(), max_bytes)?;
    let mut data = Vec::with_capacity(m.len() as usize);
    (&mut file)
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| Error::io("read", path, e))?;
    refuse_if_over(path, data.len() as u64, max_bytes)?;
    Ok(data)
}

/// `rename(from, to)` that fails with `EEXIST` rather than replace `to`:
/// `renameat2(RENAME_NOREPLACE)`, or where the file system lacks it a hard
/// link plus unlink (files) or an existence check plus rename (folders,
/// which cannot be hard-linked; racy only against another quarantine of the
/// same name within the same second).
pub fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
    };
    let (cf, ct) = (c(from)?, c(to)?);
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves them
    // like rename(2) does.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cf.as_ptr(),
            libc::AT_FDCWD,
            ct.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
        return Err(err);
    }
    match fs::hard_link(from, to) {
        Ok(()) => {
            if let Err(e) = fs::remove_file(from) {
                let _ = fs::remove_file(to);
                return Err(e);
            }
            Ok(())
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(e),
        Err(_) => {
            if fs::symlink_metadata(to).is_ok() {
                return Err(std::io::Error::from_raw_os_error(libc::EEXIST));
            }
            fs::rename(from, to)
        }
    }
}

/// Move a bad file (or folder, FIFO, symlink...) aside to
/// `<path>.corrupt-<unix seconds>`, or `<path>.corrupt-<secs>.<n>` if that is
/// taken: never overwriting an earlier quarantined copy, even one made in the
/// same second. The entry itself is moved (a symlink is not followed).
/// Returns where it went.
pub fn quarantine(path: &Path) -> std::io::Result<PathBuf> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for n in 0..10_000u32 {
        let mut s = path.as_os_str().to_owned();
        if n == 0 {
            s.push(format!(".corrupt-{secs}"));
        } else {
            s.push(format!(".corrupt-{secs}.{n}"));
        }
        let aside = PathBuf::from(s);
        match rename_noreplace(path, &aside) {
            Ok(()) => return Ok(aside),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EEXIST))
}

/// fsync a folder (makes renames and creations in it durable).
pub fn fsync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| Error::io("open folder", dir, e))?;
    d.sync_all().map_err(|e| Error::io("fsync folder", dir, e))
}

/// fsync each regular file of `files`, then each folder holding one: makes
/// files written without an fsync durable, later and off the critical path.
/// Never follows a symlink nor opens a FIFO or device (such entries are
/// skipped as not regular); a file gone since is skipped. Returns the
/// entries that could not be made durable, each with the reason.
pub fn sync_files(files: &[PathBuf]) -> Vec<(PathBuf, String)> {
    let mut failed = Vec::new();
    let mut folders: Vec<PathBuf> = Vec::new();
    for path in files {
        let opened = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path);
        let file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => {
                failed.push((path.clone(), e.to_string()));
                continue;
            }
        };
        match file.metadata() {
            Ok(m) if m.file_type().is_file() => {}
            Ok(m) => {
                failed.push((path.clone(), format!("{} is not a regular file", describe(&m))));
                continue;
            }
            Err(e) => {
                failed.push((path.clone(), e.to_string()));
                continue;
            }
        }
        if let Err(e) = file.sync_all() {
            failed.push((path.clone(), e.to_string()));
            continue;
        }
        if let Some(parent) = path.parent() {
            if !folders.iter().any(|f| f == parent) {
                folders.push(parent.to_path_buf());
            }
        }
    }
    for folder in folders {
        if let Err(e) = fsync_dir(&folder) {
            failed.push((folder, e.to_string()));
        }
    }
    failed
}

/// Create `dir` and any missing parents, each private to the user (0700).
pub fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io("create folder", dir, e))
}

/// Try a non-blocking exclusive `flock` on an open file: `Ok(true)` taken,
/// `Ok(false)` someone else holds it.
pub fn try_flock(file: &File) -> std::io::Result<bool> {
    // SAFETY: fd is a valid open descriptor owned by `file`.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Write `data` to `dir/name` atomically: temp file in the same folder, fsync,
/// rename, fsync of the folder. On any failure the temp file is removed and
/// nothing else is touched.
pub fn write_atomic(dir: &Path, name: &str, data: &[u8], host: &str, fsync: bool) -> Result<PathBuf> {
    write_atomic_parts(dir, name, &[data], host, fsync)
}

/// [`write_atomic`] of the concatenation of `parts`.
///
/// The temp file is named after its writer ([`proc::temp_name`]) and carries
/// an exclusive `flock` from creation until it has been renamed into place,
/// so a reader cleaning up temp files can tell a live writer's file from a
/// dead one's whatever PID namespace either lives in.
pub fn write_atomic_parts(
    dir: &Path,
    name: &str,
    parts: &[&[u8]],
    host: &str,
    fsync: bool,
) -> Result<PathBuf> {
    let tmp = dir.join(proc::temp_name(host));
    let fin = dir.join(name);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|e| Error::io("create", &tmp, e))?;
        // Held until `f` drops, after the rename. A file system without
        // flock leaves only the age rule to protect the file (see
        // `Index::clean_temps`).
        let _ = try_flock(&f);
        for part in parts {
            f.write_all(part).map_err(|e| Error::io("write", &tmp, e))?;
        }
        if fsync {
            f.sync_all().map_err(|e| Error::io("fsync", &tmp, e))?;
        }
        fs::rename(&tmp, &fin).map_err(|e| Error::io("rename into place", &fin, e))?;
        drop(f);
        Ok(())
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if fsync {
        fsync_dir(dir)?;
    }
    Ok(fin)
}

/// An exclusive `flock` on a sidecar file; released on drop, and by the
/// kernel if the holder dies.
#[derive(Debug)]
pub struct FileLock {
    file: File,
}

impl FileLock {
    /// Try to take the lock; with `timeout` `None` do not wait. The lock file
    /// is created if missing; anything but a regular file there (a symlink,
    /// FIFO, folder, device) is refused (`Error::Refused`) without being
    /// followed or opened.
    pub fn acquire(path: &Path, timeout: Option<Duration>) -> Result<Option<FileLock>> {
        match fs::symlink_metadata(path) {
            Ok(m) => refuse_unless_regular(path, &m)?,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("open lock file", path, e)),
        }
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(Error::refused(path, libc::ELOOP, "a symbolic link; not followed"))
            }
            Err(e) => return Err(Error::io("open lock file", path, e)),
        };
        let m = file.metadata().map_err(|e| Error::io("stat", path, e))?;
        refuse_unless_regular(path, &m)?;
        let start = Instant::now();
        let mut backoff = Duration::from_micros(200);
        loop {
            match try_flock(&file) {
                Ok(true) => return Ok(Some(FileLock { file })),
                Ok(false) => {}
                Err(e) => return Err(Error::io("lock", path, e)),
            }
            match timeout {
                None => return Ok(None),
                Some(t) if start.elapsed() >= t => {
                    return Err(Error::LockTimeout {
                        path: path.to_path_buf(),
                        waited_secs: start.elapsed().as_secs_f64(),
                    })
                }
                Some(_) => {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(20));
                }
            }
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // SAFETY: fd is valid until `file` drops right after this.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }

    #[test]
    fn sync_files_syncs_regular_files_and_reports_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        fs::write(p.join("a"), b"data").unwrap();
        mkfifo(&p.join("fifo"));
        std::os::unix::fs::symlink(p.join("a"), p.join("link")).unwrap();
        let files = [p.join("a"), p.join("gone"), p.join("fifo"), p.join("link")];
        let failed = sync_files(&files);
        let named: Vec<&PathBuf> = failed.iter().map(|(f, _)| f).collect();
        assert_eq!(named, vec![&p.join("fifo"), &p.join("link")], "{failed:?}");
        assert!(failed[0].1.contains("FIFO"), "{failed:?}");
        assert_eq!(fs::read(p.join("a")).unwrap(), b"data");
    }

    #[test]
    fn read_regular_file_refuses_hostile_types_promptly() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        fs::write(p.join("good"), b"hello").unwrap();
        assert_eq!(read_regular_file(&p.join("good"), 5).unwrap(), b"hello");
        mkfifo(&p.join("fifo"));
        std::os::unix::fs::symlink("/dev/zero", p.join("zero")).unwrap();
        std::os::unix::fs::symlink(p.join("nowhere"), p.join("dangling")).unwrap();
        std::os::unix::fs::symlink(p.join("good"), p.join("link-to-good")).unwrap();
        fs::create_dir(p.join("dir")).unwrap();
        let big = File::create(p.join("sparse")).unwrap();
        big.set_len(8 << 30).unwrap();
        let t0 = Instant::now();
        for (name, errno) in [
            ("fifo", libc::ENXIO),
            ("zero", libc::ELOOP),
            ("dangling", libc::ELOOP),
            ("link-to-good", libc::ELOOP),
            ("dir", libc::EISDIR),
            ("sparse", libc::EFBIG),
        ] {
            let err = read_regular_file(&p.join(name), DEFAULT_MAX_FILE_BYTES).unwrap_err();
            assert!(matches!(err, Error::Refused { .. }), "{name}: {err}");
            assert_eq!(err.raw_os_error(), Some(errno), "{name}: {err}");
            assert_eq!(err.path(), Some(p.join(name).as_path()));
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(read_regular_file(&p.join("good"), 4).is_err(), "over the cap");
        let missing = read_regular_file(&p.join("missing"), 10).unwrap_err();
        assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn quarantine_never_overwrites_an_earlier_copy() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log-1.json");
        let mut asides = Vec::new();
        for i in 0..4 {
            fs::write(&p, format!("copy {i}")).unwrap();
            asides.push(quarantine(&p).unwrap());
            assert!(!p.exists());
        }
        for (i, a) in asides.iter().enumerate() {
            assert_eq!(fs::read_to_string(a).unwrap(), format!("copy {i}"));
            let n = a.file_name().unwrap().to_str().unwrap();
            assert!(n.starts_with("log-1.json.corrupt-"), "{n}");
        }
        // Folders, FIFOs and symlinks move too (the entry, not its target).
        fs::create_dir(d.path().join("dir")).unwrap();
        assert!(quarantine(&d.path().join("dir")).unwrap().is_dir());
        std::os::unix::fs::symlink("/dev/zero", d.path().join("zero")).unwrap();
        let z = quarantine(&d.path().join("zero")).unwrap();
        assert!(fs::symlink_metadata(z).unwrap().file_type().is_symlink());
        assert_eq!(
            quarantine(&d.path().join("missing")).unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }

    #[test]
    fn rename_noreplace_refuses_an_existing_target() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("a"), b"a").unwrap();
        fs::write(d.path().join("b"), b"b").unwrap();
        let err = rename_noreplace(&d.path().join("a"), &d.path().join("b")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::AlreadyExists);
        assert_eq!(fs::read(d.path().join("b")).unwrap(), b"b");
    }

    #[test]
    fn write_atomic_leaves_no_temp_on_failure() {
        let d = tempfile::tempdir().unwrap();
        // Renaming onto an existing non-empty folder fails.
        fs::create_dir(d.path().join("target")).unwrap();
        fs::write(d.path().join("target").join("x"), b"x").unwrap();
        let err = write_atomic(d.path(), "target", b"data", "h", false).unwrap_err();
        assert!(matches!(err, Error::Io { .. }));
        assert_eq!(names(d.path()), vec!["target".to_owned()]);
    }

    #[test]
    fn lock_is_exclusive_and_taken_over_when_holder_goes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("LOCK");
        let held = FileLock::acquire(&p, None).unwrap().expect("first taker gets it");
        // A second open file description cannot take it...
        assert!(FileLock::acquire(&p, None).unwrap().is_none());
        let err = FileLock::acquire(&p, Some(Duration::from_millis(30))).unwrap_err();
        assert!(matches!(err, Error::LockTimeout { .. }));
        // ...until the holder goes away (closing the descriptor is what the
        // kernel does when a process dies).
        drop(held);
        assert!(FileLock::acquire(&p, None).unwrap().is_some());
    }

    #[test]
    fn lock_file_that_is_not_a_regular_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        std::os::unix::fs::symlink(&outside, d.path().join("LOCK")).unwrap();
        let err = FileLock::acquire(&d.path().join("LOCK"), None).unwrap_err();
        assert!(matches!(err, Error::Refused { .. }), "{err}");
        assert!(!outside.exists(), "the symlink was not followed");
        mkfifo(&d.path().join("LOCK2"));
        let err = FileLock::acquire(&d.path().join("LOCK2"), None).unwrap_err();
        assert!(matches!(err, Error::Refused { .. }), "{err}");
    }

    #[test]
    fn lock_of_killed_process_is_free() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("LOCK");
        // A child holds the lock with flock(1) semantics via a shell-free fork.
        // SAFETY: the child only calls async-signal-safe functions before _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let path = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o644);
                libc::flock(fd, libc::LOCK_EX);
                libc::pause();
                libc::_exit(0);
            }
        }
        // Wait until the child holds it.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match FileLock::acquire(&p, None).unwrap() {
                Some(l) => {
                    drop(l);
                    std::thread::sleep(Duration::from_millis(5));
                }
                None => break,
            }
            assert!(Instant::now() < deadline, "child never took the lock");
        }
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert!(FileLock::acquire(&p, Some(Duration::from_secs(5)))
            .unwrap()
            .is_some());
    }
}
