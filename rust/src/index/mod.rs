//! The cache index: a map `(range_start, range_end, graph_index, compiler) ->
//! value` shared by many processes on one host or on several hosts through a
//! shared file system.
//!
//! # Protocol
//!
//! The index is a folder of write-once files; no file is ever modified:
//!
//! * `log-<stamp>.json`: one per commit, holding the entries (and removals)
//!   of that commit;
//! * `snap-<stamp>.json`: a compaction of earlier logs and snapshots;
//! * `.tmp-<host>-<namespace>-<pid>-<rand>`: a file being written, `flock`ed
//!   by its writer until renamed into place; never read;
//! * `LOCK`: sidecar lock file, `flock`ed only to keep compactions on one
//!   host from duplicating work (correctness never depends on it);
//! * `<file>.corrupt-<unix seconds>[.<n>]`: a file that failed verification
//!   or is not a regular file, moved aside.
//!
//! Every file is written to a temp file in the same folder, fsynced, renamed
//! to its final (unique) name, and the folder is fsynced. A reader therefore
//! sees a file whole or not at all. The format is in [`format`], the merge
//! and the stamps in [`state`].
//!
//! The state is the per-key maximum over all files (last-writer-wins map):
//! merging is commutative, associative and idempotent, so readers may union
//! files in any order, and two compactions racing on different hosts (where
//! `flock` may be node-local) lose nothing: each writes a snapshot containing
//! everything it read *before* deleting what it read. A reader that finds a
//! listed file gone (compacted away) lists again: the snapshot that absorbed
//! it is then there.
//!
//! A commit writes one small file whatever the size of the index, so its cost
//! does not grow with the index. Compaction rewrites every entry, so it runs
//! only once `max(compact_after, entries / ENTRIES_PER_LOG)` logs have piled
//! up: its cost, linear in the index, is spread over a number of commits that
//! grows as fast, and the amortised cost of a commit stays flat.
//!
//! # Hostile files
//!
//! The folder may hold anything. Data files are read only through
//! [`fsutil::read_regular_file`]: a symlink (dangling or not, wherever it
//! points), folder, FIFO, socket, device or file over
//! [`Options::max_file_bytes`] named like a data file is never opened or
//! followed; it is reported as a [`Problem`] and moved aside (or, if it
//! cannot be moved, skipped), and the index works without it. The index
//! folder itself being a symlink is refused with an error naming it.
//!
//! # Temp files and liveness
//!
//! A reader removes another writer's temp file only when it can take a
//! non-blocking `flock` on it (its writer holds one until the rename) *and*
//! the file is older than [`Options::stale_temp_after`] or its writer is
//! provably dead ([`proc::TempOwner::provably_dead`]: same host name *and*
//! same PID namespace of the same boot, and no such pid). So no reader ever
//! removes a live writer's file, whatever container either runs in.

pub mod format;
pub mod state;

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;

use self::format::{encode_file, kind_of, parse_body, verify_file_capped, Body, FileKind};
pub use self::format::{verify_bytes, verify_file, FORMAT_VERSION, MAX_VALUE_DEPTH};
use self::state::{now_nanos, Clock, Slot, Stamp, State};
pub use self::state::{Key, Value};
use crate::error::{Error, Result};
use crate::fsutil::{self, FileLock, DEFAULT_MAX_FILE_BYTES};
use crate::proc::{self, TempOwner, TMP_PREFIX};

/// Compaction waits for at least one log per this many entries of the index
/// (see the module docs): at 10,000 entries, 312 logs. Smaller would make big
/// indexes compact more often (a commit costs more); larger would leave more
/// small files for a cold reader to open.
pub const ENTRIES_PER_LOG: usize = 32;

const LOCK_NAME: &str = "LOCK";

/// Options of an index handle.
#[derive(Debug, Clone)]
pub struct Options {
    /// Host name written in stamps and file names (default: this host's).
    pub host: String,
    /// Take the sidecar `flock` around compaction.
    pub use_flock: bool,
    /// Compact once at least this many logs are present (and at least one
    /// per [`ENTRIES_PER_LOG`] entries of the index).
    pub compact_after: usize,
    /// fsync files and the folder on every write.
    pub fsync: bool,
    /// Temp files older than this are removed whatever their owner (if no
    /// writer holds their `flock`).
    pub stale_temp_after: Duration,
    /// Never write: no folder created, no temp cleanup, corrupt files are
    /// skipped (not moved aside), commits fail with `EROFS`. For read-only
    /// mounts and deployments that must not touch the cache.
    pub readonly: bool,
    /// Data files larger than this are refused unread (a [`Problem`]).
    pub max_file_bytes: u64,
    /// Entries stamped more than this past this host's clock are reported
    /// (a [`Problem`] of kind [`ProblemKind::FutureStamp`]); see
    /// [`state`] for how they are ordered.
    pub max_clock_skew: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host: proc::this_host(),
            use_flock: true,
            compact_after: 64,
            fsync: true,
            stale_temp_after: Duration::from_secs(3600),
            readonly: false,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_clock_skew: Duration::from_secs(3600),
        }
    }
}

/// What kind of thing was wrong with a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// Failed verification (header, version, checksum, JSON, stamps,
    /// nesting), or is a file where the index folder should be: its entries
    /// count as missing.
    Corrupt,
    /// Not a regular file (symlink, folder, FIFO, socket, device) or over
    /// the size cap: never read.
    Refused,
    /// Valid, but holds entries stamped too far in the future: they are
    /// used, ordered as stamped, and superseded by any later commit of the
    /// same key.
    FutureStamp,
}

/// What a verification found wrong with one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub reason: String,
    /// Where the file was moved aside to, if it was.
    pub moved_to: Option<PathBuf>,
    pub kind: ProblemKind,
}

/// A handle on an index folder with an in-memory view of its state.
#[derive(Debug)]
pub struct Index {
    dir: PathBuf,
    opts: Options,
    state: State,
    /// Files already merged into `state` (their names), among those last listed.
    seen: HashSet<String>,
    logs_on_disk: usize,
    clock: Clock,
    /// Problems found since the caller last drained them.
    problems: Vec<Problem>,
    /// Bad files that could not be moved aside (e.g. a read-only folder):
    /// skipped, and reported once per handle rather than on every refresh.
    unmovable: HashSet<String>,
}

struct Listing {
    data_files: Vec<String>,
    temps: Vec<String>,
}

/// Refuse an index folder that is a symlink (it could point anywhere).
fn refuse_symlinked_folder(dir: &Path, m: &fs::Metadata) -> Result<()> {
    if m.file_type().is_symlink() {
        let target = fs::read_link(dir)
            .map(|t| format!(" (to {})", t.display()))
            .unwrap_or_default();
        return Err(Error::refused(
            dir,
            libc::ELOOP,
            format!("the index folder is a symbolic link{target}; not followed (point the cache at the real folder)"),
        ));
    }
    Ok(())
}

impl Index {
    /// Open (creating the folder if needed) and load the index at `dir`.
    pub fn open(dir: impl Into<PathBuf>, opts: Options) -> Result<Index> {
        let dir = dir.into();
        let mut problems = Vec::new();
        let readonly = opts.readonly;
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() => refuse_symlinked_folder(&dir, &m)?,
            Ok(m) if m.is_dir() => {}
            Ok(m) if readonly => problems.push(Problem {
                file: dir.clone(),
                reason: format!(
                    "the index path is {}, not a folder (read-only: left in place)",
                    fsutil::describe(&m)
                ),
                moved_to: None,
                kind: ProblemKind::Corrupt,
            }),
            Err(e) if e.kind() == ErrorKind::NotFound && readonly => {}
            Ok(m) => {
                // Not a folder (e.g. a stray or torn file from another tool): move it aside.
                let aside = fsutil::quarantine(&dir).map_err(|e| Error::io("move aside", &dir, e))?;
                fsutil::create_private_dir(&dir)?;
                problems.push(Problem {
                    file: dir.clone(),
                    reason: format!("the index path is {}, not a folder", fsutil::describe(&m)),
                    moved_to: Some(aside),
                    kind: ProblemKind::Corrupt,
                });
            }
            Err(e) if e.kind() == ErrorKind::NotFound => fsutil::create_private_dir(&dir)?,
            Err(e) => return Err(Error::io("open folder", &dir, e)),
        }
        let mut idx = Index {
            dir,
            opts,
            state: State::default(),
            seen: HashSet::new(),
            logs_on_disk: 0,
            clock: Clock::default(),
            problems,
            unmovable: HashSet::new(),
        };
        idx.refresh()?;
        Ok(idx)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Problems found since the last call.
    pub fn take_problems(&mut self) -> Vec<Problem> {
        std::mem::take(&mut self.problems)
    }

    fn list(&self) -> Result<Listing> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            // A read-only handle on an index nobody created yet: empty.
            Err(e) if self.opts.readonly && e.kind() == ErrorKind::NotFound => {
                return Ok(Listing {
                    data_files: Vec::new(),
                    temps: Vec::new(),
                })
            }
            Err(e) => return Err(Error::io("list", &self.dir, e)),
        };
        let mut data_files = Vec::new();
        let mut temps = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| Error::io("list", &self.dir, e))?;
            let Ok(name) = ent.file_name().into_string() else {
                continue;
            };
            if name.starts_with(TMP_PREFIX) {
                temps.push(name);
            } else if kind_of(&name).is_some() {
                data_files.push(name);
            }
        }
        data_files.sort_unstable();
        Ok(Listing { data_files, temps })
    }

    fn merge_body(&mut self, body: Body<'_>, stamps: &[Arc<Stamp>]) {
        // Loading a snapshot into an empty map: size it once, not by doubling.
        self.state
            .reserve((body.entries.len() + body.removed.len()).saturating_sub(self.state.slots()));
        for (s, e, g, c, v, i) in body.entries {
            let raw = v.to_owned();
            self.state.merge(
                Key::new(s, e, g, c.0),
                Slot {
                    value: Some(raw),
                    stamp: stamps[i].clone(),
                },
            );
        }
        for (s, e, g, c, i) in body.removed {
            self.state.merge(
                Key::new(s, e, g, c.0),
                Slot {
                    value: None,
                    stamp: stamps[i].clone(),
                },
            );
        }
    }

    /// Report a file that must not be merged and move it aside (unless
    /// read-only, or it cannot be moved: then it is skipped from now on).
    fn set_aside(&mut self, name: &str, reason: String, kind: ProblemKind) {
        let path = self.dir.join(name);
        if self.opts.readonly {
            if self.unmovable.insert(name.to_owned()) {
                self.problems.push(Problem {
                    file: path,
                    reason,
                    moved_to: None,
                    kind,
                });
            }
            return;
        }
        let moved_to = match fsutil::quarantine(&path) {
            Ok(aside) => Some(aside),
            // Another process moved it aside first: nothing left to skip or report.
            Err(e) if e.kind() == ErrorKind::NotFound => return,
            Err(_) => {
                self.unmovable.insert(name.to_owned());
                None
            }
        };
        self.problems.push(Problem {
            file: path,
            reason,
            moved_to,
            kind,
        });
    }

    /// Report the stamps of a file that lie more than the allowed skew past
    /// this host's clock (not those made by the per-key clock rule).
    fn check_future(&mut self, name: &str, stamps: &[Arc<Stamp>]) {
        let now = now_nanos();
        let limit = now.saturating_add(self.opts.max_clock_skew.as_nanos());
        let future: Vec<&Arc<Stamp>> = stamps
            .iter()
            .filter(|s| s.nanos > limit && !s.is_logical())
            .collect();
        let Some(latest) = future.iter().map(|s| s.nanos).max() else {
            return;
        };
        let ahead = (latest - now) / 1_000_000_000;
        self.problems.push(Problem {
            file: self.dir.join(name),
            reason: format!(
                "{} stamp(s) up to {ahead} s past this host's clock (more than the allowed skew of {} s): a host with a wrong clock wrote it; its entries are used as stamped, and a later insert or remove of the same key still supersedes them",
                future.len(),
                self.opts.max_clock_skew.as_secs()
            ),
            moved_to: None,
            kind: ProblemKind::FutureStamp,
        });
    }

    /// Merge every file written since the last refresh. Readers take no lock.
    pub fn refresh(&mut self) -> Result<()> {
        const ATTEMPTS: usize = 16;
        for _ in 0..ATTEMPTS {
            let listing = self.list()?;
            if !self.opts.readonly {
                self.clean_temps(&listing.temps);
            }
            let present: HashSet<&str> = listing.data_files.iter().map(|s| s.as_str()).collect();
            self.seen.retain(|n| present.contains(n.as_str()));
            self.logs_on_disk = listing
                .data_files
                .iter()
                .filter(|n| kind_of(n) == Some(FileKind::Log))
                .count();
            let mut vanished = false;
            for name in &listing.data_files {
                if self.seen.contains(name) || self.unmovable.contains(name) {
                    continue;
                }
                let path = self.dir.join(name);
                let data = match fsutil::read_regular_file(&path, self.opts.max_file_bytes) {
                    Ok(d) => d,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) && matches!(e, Error::Io { .. }) => {
                        // Compacted away after we listed: the snapshot that
                        // absorbed it exists now; list again. (A dangling
                        // symlink is refused above, never taken for this.)
                        vanished = true;
                        continue;
                    }
                    Err(Error::Refused { reason, .. }) => {
                        self.set_aside(name, reason, ProblemKind::Refused);
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let parsed = verify_bytes(&path, &data).and_then(|b| parse_body(&path, b));
                match parsed {
                    Ok((body, stamps)) => {
                        self.check_future(name, &stamps);
                        self.merge_body(body, &stamps);
                        self.seen.insert(name.clone());
                    }
                    Err(Error::Corrupt { reason, .. }) => self.set_aside(name, reason, ProblemKind::Corrupt),
                    Err(e) => return Err(e),
                }
            }
            if !vanished {
                return Ok(());
            }
        }
        Err(Error::io(
            "read a stable listing of",
            &self.dir,
            std::io::Error::other("files kept vanishing under concurrent compaction"),
        ))
    }

    /// Remove temp files left by dead writers. A temp file goes only if no
    /// writer holds its `flock` (each holds one until its rename) and it is
    /// older than `stale_temp_after` or its writer is provably dead (same
    /// host, same PID namespace of the same boot, pid gone). Anything that
    /// is not a regular file is left alone (never ours, never read).
    fn clean_temps(&self, temps: &[String]) {
        for name in temps {
            let path = self.dir.join(name);
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.file_type().is_file() {
                continue;
            }
            let stale = meta
                .modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= self.opts.stale_temp_after);
            let dead = || TempOwner::parse(name).is_some_and(|o| o.provably_dead(&self.opts.host));
            if !(stale || dead()) {
                continue;
            }
            let Ok(file) = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
                .open(&path)
            else {
                continue;
            };
            match fsutil::try_flock(&file) {
                Ok(true) => {}
                // A live writer holds it.
                Ok(false) => continue,
                // No flock on this file system: the age and death rules alone.
                Err(_) => {}
            }
            // Still the file we locked (not renamed away and replaced)?
            let same = |m: &fs::Metadata| (m.dev(), m.ino()) == (meta.dev(), meta.ino());
            let locked_same = file.metadata().is_ok_and(|m| same(&m));
            let path_same = fs::symlink_metadata(&path).is_ok_and(|m| same(&m));
            if locked_same && path_same {
                let _ = fs::remove_file(&path);
            }
        }
    }

    pub fn get(&self, key: &Key) -> Option<&RawValue> {
        self.state.get(key)
    }

    pub fn len(&self) -> usize {
        self.state.len()
    }

    pub fn is_empty(&self) -> bool {
        self.state.is_empty()
    }

    /// Live entries, sorted by key.
    pub fn entries(&self) -> Vec<(&Key, &RawValue)> {
        let mut v: Vec<(&Key, &RawValue)> = self
            .state
            .iter()
            .filter_map(|(k, s)| s.value.as_deref().map(|v| (k, v)))
            .collect();
        v.sort_unstable_by(|a, b| a.0.cmp(b.0));
        v
    }

    fn check_writable(&self) -> Result<()> {
        if self.opts.readonly {
            return Err(Error::io(
                "write to read-only index",
                &self.dir,
                std::io::Error::from_raw_os_error(libc::EROFS),
            ));
        }
        Ok(())
    }

    /// Commit a batch of puts (`Some`) and removals (`None`) as one durable,
    /// atomic file. Returns once the commit is on disk. Each entry
    /// supersedes whatever this handle has seen for its key, even an entry
    /// stamped in the future (see [`state`]).
    pub fn commit(&mut self, ops: Vec<(Key, Option<Value>)>) -> Result<()> {
        self.check_writable()?;
        if ops.is_empty() {
            return Ok(());
        }
        let stamp = self.clock.next(&self.opts.host);
        let slots: Vec<(Key, Slot)> = ops
            .into_iter()
            .map(|(k, v)| {
                let stamp = match self.state.stamp_of(&k) {
                    Some(prev) if **prev >= *stamp => self.clock.after(prev, &self.opts.host),
                    _ => stamp.clone(),
                };
                (k, Slot { value: v, stamp })
            })
            .collect();
        let items: Vec<(&Key, &Slot)> = slots.iter().map(|(k, s)| (k, s)).collect();
        let (header, body) = encode_file("log", &items);
        let name = format!("log-{}.json", stamp.text);
        fsutil::write_atomic_parts(
            &self.dir,
            &name,
            &[&header, &body],
            &self.opts.host,
            self.opts.fsync,
        )?;
        self.seen.insert(name);
        self.logs_on_disk += 1;
        for (k, s) in slots {
            self.state.merge(k, s);
        }
        if self.logs_on_disk >= self.compact_threshold() {
            // The commit is durable now: a compaction that fails (e.g. the
            // disk filled up) must not report it as failed. Its logs stay
            // and the next commit tries again.
            let _ = self.auto_compact();
        }
        Ok(())
    }

    /// Logs that trigger a compaction at the index's current size.
    pub fn compact_threshold(&self) -> usize {
        self.opts.compact_after.max(self.state.slots() / ENTRIES_PER_LOG)
    }

    fn auto_compact(&mut self) -> Result<()> {
        // Count what is really there (other writers' logs included) before paying for it.
        let listing = self.list()?;
        self.logs_on_disk = listing
            .data_files
            .iter()
            .filter(|n| kind_of(n) == Some(FileKind::Log))
            .count();
        if self.logs_on_disk >= self.compact_threshold() {
            self.compact(None)?;
        }
        Ok(())
    }

    pub fn insert(&mut self, key: Key, value: Value) -> Result<()> {
        self.commit(vec![(key, Some(value))])
    }

    /// Remove an entry; returns whether this view held it.
    pub fn remove(&mut self, key: Key) -> Result<bool> {
        let had = self.get(&key).is_some();
        self.commit(vec![(key, None)])?;
        Ok(had)
    }

    /// Merge every file into one snapshot and delete the files it absorbed.
    /// With `wait` `None`, skip (return `false`) if another process on this
    /// host is compacting; otherwise wait up to `wait` for it. A `LOCK` that
    /// is not a regular file (symlink, FIFO...) is moved aside and replaced.
    pub fn compact(&mut self, wait: Option<Duration>) -> Result<bool> {
        self.check_writable()?;
        let _lock = if self.opts.use_flock {
            let lock_path = self.dir.join(LOCK_NAME);
            let taken = match FileLock::acquire(&lock_path, wait) {
                Err(Error::Refused { reason, .. }) => {
                    self.set_aside(LOCK_NAME, reason, ProblemKind::Refused);
                    FileLock::acquire(&lock_path, wait)?
                }
                other => other?,
            };
            match taken {
                Some(l) => Some(l),
                None => return Ok(false),
            }
        } else {
            None
        };
        self.refresh()?;
        self.compact_seen()?;
        Ok(true)
    }

    /// Write the in-memory state as a snapshot, then delete the files it was
    /// merged from. Safe without any lock: everything deleted is in the
    /// snapshot, which is durable before the first deletion.
    fn compact_seen(&mut self) -> Result<()> {
        let absorbed: Vec<String> = {
            let mut v: Vec<String> = self.seen.iter().cloned().collect();
            v.sort_unstable();
            v
        };
        if absorbed.len() <= 1 && absorbed.iter().all(|n| n.starts_with("snap-")) {
            return Ok(());
        }
        let stamp = self.clock.next(&self.opts.host);
        let mut items: Vec<(&Key, &Slot)> = self.state.iter().collect();
        items.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let (header, body) = encode_file("snapshot", &items);
        drop(items);
        let name = format!("snap-{}.json", stamp.text);
        fsutil::write_atomic_parts(
            &self.dir,
            &name,
            &[&header, &body],
            &self.opts.host,
            self.opts.fsync,
        )?;
        // The snapshot is durable: only now delete what it absorbed.
        for old in &absorbed {
            match fs::remove_file(self.dir.join(old)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove compacted file", &self.dir.join(old), e)),
            }
            self.seen.remove(old);
        }
        self.seen.insert(name);
        self.logs_on_disk = 0;
        // No folder fsync for the deletions: the snapshot, durable before the
        // first of them, holds everything the deleted files held. If a crash
        // undoes some deletions, those files come back and merge idempotently.
        Ok(())
    }

    /// Check every file of the index (with the same safe reader and checks
    /// as loading it); with `repair`, move bad ones aside.
    pub fn verify(dir: &Path, repair: bool) -> Result<(usize, Vec<Problem>)> {
        Self::verify_capped(dir, repair, DEFAULT_MAX_FILE_BYTES)
    }

    /// [`Index::verify`] with a size cap on files.
    pub fn verify_capped(dir: &Path, repair: bool, max_bytes: u64) -> Result<(usize, Vec<Problem>)> {
        if let Ok(m) = fs::symlink_metadata(dir) {
            refuse_symlinked_folder(dir, &m)?;
        }
        let rd = fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
        let mut ok = 0;
        let mut problems = Vec::new();
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| kind_of(n).is_some())
            .collect();
        names.sort_unstable();
        for name in names {
            let path = dir.join(&name);
            let (reason, kind) = match verify_file_capped(&path, max_bytes) {
                Ok(_) => {
                    ok += 1;
                    continue;
                }
                Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => continue,
                Err(Error::Corrupt { reason, .. }) => (reason, ProblemKind::Corrupt),
                Err(Error::Refused { reason, .. }) => (reason, ProblemKind::Refused),
                Err(e) => return Err(e),
            };
            let moved_to = if repair {
                fsutil::quarantine(&path).ok()
            } else {
                None
            };
            problems.push(Problem {
                file: path,
                reason,
                moved_to,
                kind,
            });
        }
        Ok((ok, problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Value {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    fn opts() -> Options {
        Options {
            fsync: false,
            ..Options::default()
        }
    }

    fn data_files(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn readonly_handle_never_writes() {
        let d = tempfile::tempdir().unwrap();
        let ro = Options {
            readonly: true,
            ..opts()
        };
        // Missing index: empty, nothing created.
        let missing = d.path().join("nope");
        let mut r = Index::open(&missing, ro.clone()).unwrap();
        assert!(r.is_empty() && !missing.exists());
        let err = r.insert(Key::new(1, 1, 0, "c"), raw("1")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        assert!(!missing.exists());
        // Existing index with a corrupt file and a stale temp: read, leave both.
        let mut w = Index::open(d.path().join("idx"), opts()).unwrap();
        w.insert(Key::new(1, 1, 0, "c"), raw("1")).unwrap();
        w.insert(Key::new(2, 2, 0, "c"), raw("2")).unwrap();
        let name = data_files(&d.path().join("idx"))
            .into_iter()
            .find(|n| n.starts_with("log-"))
            .unwrap();
        fs::write(d.path().join("idx").join(&name), b"garbage").unwrap();
        let temp = d.path().join("idx").join(".tmp-otherhost-1-00000000deadbeef");
        fs::write(&temp, b"half").unwrap();
        let before = data_files(&d.path().join("idx"));
        let mut r = Index::open(
            d.path().join("idx"),
            Options {
                stale_temp_after: Duration::ZERO,
                ..ro
            },
        )
        .unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r.take_problems().len(), 1);
        r.refresh().unwrap();
        assert!(r.take_problems().is_empty(), "reported once");
        assert_eq!(data_files(&d.path().join("idx")), before);
        assert!(r.compact(None).is_err());
    }

    #[test]
    fn folders_are_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a").join("b");
        Index::open(&p, opts()).unwrap();
        for f in [d.path().join("a"), p] {
            assert_eq!(fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o700);
        }
    }

    #[test]
    fn round_trip_and_reload() {
        let d = tempfile::tempdir().unwrap();
        let mut a = Index::open(d.path().join("idx"), opts()).unwrap();
        a.insert(Key::new(1, 8, 0, "inductor"), raw(r#"{"path":"x"}"#))
            .unwrap();
        a.insert(Key::new(9, 32, 2, "eager"), raw("null")).unwrap();
        let b = Index::open(d.path().join("idx"), opts()).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(
            b.get(&Key::new(1, 8, 0, "inductor")).unwrap().get(),
            r#"{"path":"x"}"#
        );
        assert_eq!(b.get(&Key::new(9, 32, 2, "eager")).unwrap().get(), "null");
        assert!(b.get(&Key::new(1, 8, 1, "inductor")).is_none());
    }

    #[test]
    fn keys_needing_json_escapes_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let mut a = Index::open(d.path(), opts()).unwrap();
        let odd = "q\"uote \\ back\nline \u{0} nul \u{7f} ünï ✓";
        a.insert(Key::new(1, 2, 3, odd), raw("1")).unwrap();
        a.insert(Key::new(1, 2, 4, "plain"), raw("2")).unwrap();
        a.remove(Key::new(9, 9, 9, odd)).unwrap();
        for _ in 0..2 {
            let mut b = Index::open(d.path(), opts()).unwrap();
            assert!(b.take_problems().is_empty());
            assert_eq!(b.get(&Key::new(1, 2, 3, odd)).unwrap().get(), "1");
            assert_eq!(b.len(), 2);
            a.compact(None).unwrap();
        }
    }

    #[test]
    fn merge_is_last_writer_wins_and_order_free() {
        let d = tempfile::tempdir().unwrap();
        let mut a = Index::open(d.path(), opts()).unwrap();
        let k = Key::new(1, 1, 0, "c");
        a.insert(k.clone(), raw("1")).unwrap();
        a.insert(k.clone(), raw("2")).unwrap();
        // Merging an older slot after a newer one keeps the newer.
        let old = Slot {
            value: Some(raw("0")),
            stamp: Arc::new(Stamp::parse("00000000000000000001-h-1-0").unwrap()),
        };
        a.state.merge(k.clone(), old);
        assert_eq!(a.get(&k).unwrap().get(), "2");
        let b = Index::open(d.path(), opts()).unwrap();
        assert_eq!(b.get(&k).unwrap().get(), "2");
    }

    #[test]
    fn remove_is_durable_and_survives_compaction() {
        let d = tempfile::tempdir().unwrap();
        let mut a = Index::open(d.path(), opts()).unwrap();
        let k = Key::new(1, 1, 0, "c");
        a.insert(k.clone(), raw("1")).unwrap();
        assert!(a.remove(k.clone()).unwrap());
        assert!(a.get(&k).is_none());
        a.compact(None).unwrap();
        let b = Index::open(d.path(), opts()).unwrap();
        assert!(b.get(&k).is_none());
        assert_eq!(b.len(), 0);
    }

    #[test]
    fn compaction_absorbs_logs_into_one_snapshot() {
        let d = tempfile::tempdir().unwrap();
        let mut a = Index::open(
            d.path(),
            Options {
                compact_after: 5,
                ..opts()
            },
        )
        .unwrap();
        for i in 0..12 {
            a.insert(Key::new(i, i, 0, "c"), raw(&i.to_string())).unwrap();
        }
        let files = data_files(d.path());
        let logs = files.iter().filter(|n| n.starts_with("log-")).count();
        let snaps = files.iter().filter(|n| n.starts_with("snap-")).count();
        assert!(logs < 5, "{files:?}");
        assert_eq!(snaps, 1, "{files:?}");
        let b = Index::open(d.path(), opts()).unwrap();
        assert_eq!(b.len(), 12);
    }

    #[test]
    fn compaction_waits_longer_as_the_index_grows() {
        let d = tempfile::tempdir().unwrap();
        let mut a = Index::open(
            d.path(),
            Options {
                compact_after: 4,
                ..opts()
            },
        )
        .unwrap();
        let n = 64 * ENTRIES_PER_LOG as i64;
        a.commit((0..n).map(|i| (Key::new(i, i, 0, "c"), Some(raw("0")))).collect())
            .unwrap();
        a.compact(None).unwrap();
        assert_eq!(a.compact_threshold(), 64);
        for i in 0..63 {
            a.insert(Key::new(i, i, 0, "c"), raw("1")).unwrap();
        }
        let logs = |d: &Path| data_files(d).iter().filter(|n| n.starts_with("log-")).count();
        assert_eq!(logs(d.path()), 63, "not compacted before 64 logs");
        a.insert(Key::new(0, 0, 1, "c"), raw("1")).unwrap();
        assert_eq!(logs(d.path()), 0, "compacted at 64 logs");
        assert_eq!(Index::open(d.path(), opts()).unwrap().len(), n as usize + 1);
    }

    #[test]
    fn racing_compactions_without_lock_lose_nothing() {
        // Two "hosts" whose locks do not see each other: each compacts what it
        // saw; the union still holds every entry.
        let d = tempfile::tempdir().unwrap();
        let o1 = Options {
            host: "hostA".into(),
            use_flock: false,
            compact_after: 1000,
            ..opts()
        };
        let o2 = Options {
            host: "hostB".into(),
            ..o1.clone()
        };
        let mut a = Index::open(d.path(), o1).unwrap();
        let mut b = Index::open(d.path(), o2).unwrap();
        for i in 0..10 {
            a.insert(Key::new(i, i, 0, "a"), raw("1")).unwrap();
        }
        b.refresh().unwrap(); // b has seen a's first 10 logs
        for i in 0..10 {
            b.insert(Key::new(i, i, 1, "b"), raw("2")).unwrap();
        }
        b.refresh().unwrap(); // b's view: all 20 logs
        a.insert(Key::new(99, 99, 0, "a"), raw("3")).unwrap();
        // a compacts everything (deleting the logs b saw); b then compacts
        // from its stale view, as if its lock did not see a's: its snapshot
        // lacks a's last entry, and what it deletes is already gone.
        a.compact(None).unwrap();
        b.compact_seen().unwrap();
        let c = Index::open(d.path(), opts()).unwrap();
        assert_eq!(c.len(), 21);
    }

    #[test]
    fn checksum_detects_flipped_byte_and_truncation() {
        let d = tempfile::tempdir().unwrap();
        let mut a = Index::open(d.path(), opts()).unwrap();
        a.insert(Key::new(1, 1, 0, "c"), raw(r#""value""#)).unwrap();
        let name = data_files(d.path())
            .into_iter()
            .find(|n| n.starts_with("log-"))
            .unwrap();
        let p = d.path().join(&name);
        let good = fs::read(&p).unwrap();
        assert!(verify_file(&p).is_ok());
        let mut flipped = good.clone();
        let last = flipped.len() - 5;
        flipped[last] ^= 0x20;
        fs::write(&p, &flipped).unwrap();
        assert!(matches!(verify_file(&p), Err(Error::Corrupt { .. })));
        let mut longer = good.clone();
        longer.extend_from_slice(b"{\"extra\": 1}\n");
        fs::write(&p, &longer).unwrap();
        assert!(verify_file(&p)
            .unwrap_err()
            .to_string()
            .contains("unexpected bytes"));
        fs::write(&p, &good[..good.len() / 2]).unwrap();
        let err = verify_file(&p).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        fs::write(&p, b"").unwrap();
        assert!(verify_file(&p).unwrap_err().to_string().contains("empty"));
        let wrong = String::from_utf8(good.clone())
            .unwrap()
            .replacen(" v1 ", " v999 ", 1);
        fs::write(&p, wrong).unwrap();
        assert!(verify_file(&p).unwrap_err().to_string().contains("version"));
    }

    #[test]
    fn corrupt_file_is_moved_aside_and_reported() {
        let d = tempfile::tempdir().unwrap();
        let mut a = Index::open(d.path(), opts()).unwrap();
        a.insert(Key::new(1, 1, 0, "c"), raw("1")).unwrap();
        a.insert(Key::new(2, 2, 0, "c"), raw("2")).unwrap();
        let name = data_files(d.path())
            .into_iter()
            .find(|n| n.starts_with("log-"))
            .unwrap();
        fs::write(d.path().join(&name), b"garbage").unwrap();
        let mut b = Index::open(d.path(), opts()).unwrap();
        assert_eq!(b.len(), 1);
        let problems = b.take_problems();
        assert_eq!(problems.len(), 1);
        assert!(problems[0]
            .moved_to
            .as_ref()
            .unwrap()
            .to_str()
            .unwrap()
            .contains(".corrupt-"));
        assert!(!d.path().join(&name).exists());
    }

    #[test]
    fn a_file_at_the_index_path_is_moved_aside_and_reported() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("idx");
        fs::write(&p, b"legacy index").unwrap();
        let mut a = Index::open(&p, opts()).unwrap();
        assert!(p.is_dir());
        let problems = a.take_problems();
        assert_eq!(problems.len(), 1);
        let aside = problems[0].moved_to.clone().unwrap();
        assert_eq!(fs::read(aside).unwrap(), b"legacy index");
        a.insert(Key::new(1, 1, 0, "c"), raw("1")).unwrap();
        assert_eq!(Index::open(&p, opts()).unwrap().len(), 1);
    }

    #[test]
    fn stale_temp_of_dead_writer_is_cleaned() {
        let d = tempfile::tempdir().unwrap();
        let host = proc::this_host();
        let ns = proc::namespace_id().expect("tests run with /proc");
        // pid 2^22+ is above pid_max defaults: dead, in our own namespace.
        let dead = d
            .path()
            .join(format!(".tmp-{host}-{ns}-4999999-00000000deadbeef"));
        fs::write(&dead, b"half").unwrap();
        let other = d.path().join(".tmp-otherhost-1-00000000deadbeef");
        fs::write(&other, b"half").unwrap();
        // Same host name, another PID namespace (a container): its pid says
        // nothing here, so only age may remove it.
        let other_ns = d
            .path()
            .join(format!(".tmp-{host}-000000000000-4999999-00000000deadbeef"));
        fs::write(&other_ns, b"half").unwrap();
        // A name without a namespace id (older writers) proves nothing either.
        let no_ns = d.path().join(format!(".tmp-{host}-4999999-00000000deadbeef"));
        fs::write(&no_ns, b"half").unwrap();
        let live = d.path().join(proc::temp_name(&host));
        fs::write(&live, b"half").unwrap();
        let _ = Index::open(d.path(), opts()).unwrap();
        assert!(!dead.exists());
        assert!(other.exists(), "fresh temp of another host is left alone");
        assert!(
            other_ns.exists(),
            "fresh temp of another PID namespace is left alone"
        );
        assert!(no_ns.exists(), "fresh temp without a namespace id is left alone");
        assert!(live.exists(), "temp of a live writer is left alone");
        let _ = Index::open(
            d.path(),
            Options {
                stale_temp_after: Duration::ZERO,
                ..opts()
            },
        )
        .unwrap();
        assert!(!other.exists());
        assert!(!other_ns.exists() && !no_ns.exists());
    }

    #[test]
    fn temp_with_a_held_flock_is_never_removed() {
        let d = tempfile::tempdir().unwrap();
        let host = proc::this_host();
        let ns = proc::namespace_id().expect("tests run with /proc");
        // Claims a dead pid of our namespace, and is "stale" below; but a
        // writer holds its flock, so it is live whatever its name says.
        let held = d
            .path()
            .join(format!(".tmp-{host}-{ns}-4999999-00000000feedbeef"));
        fs::write(&held, b"half").unwrap();
        let f = fs::File::open(&held).unwrap();
        assert!(fsutil::try_flock(&f).unwrap());
        let stale = Options {
            stale_temp_after: Duration::ZERO,
            ..opts()
        };
        let mut r = Index::open(d.path(), stale.clone()).unwrap();
        r.refresh().unwrap();
        assert!(held.exists(), "a flocked temp survives any reader");
        drop(f);
        r.refresh().unwrap();
        assert!(!held.exists(), "once the flock is gone it is cleaned");
    }

    #[test]
    fn reader_retries_when_files_vanish_under_compaction() {
        let d = tempfile::tempdir().unwrap();
        let mut w = Index::open(
            d.path(),
            Options {
                compact_after: 1000,
                ..opts()
            },
        )
        .unwrap();
        let mut r = Index::open(d.path(), opts()).unwrap();
        for i in 0..20 {
            w.insert(Key::new(i, i, 0, "c"), raw("1")).unwrap();
        }
        w.compact(None).unwrap();
        // r never saw the logs; they are gone; it must find them in the snapshot.
        r.refresh().unwrap();
        assert_eq!(r.len(), 20);
    }

    /// Write a data file whose entries carry the given stamps (a crafted
    /// file, checksum and all, as another writer could have made it).
    fn craft(dir: &Path, name: &str, items: &[(Key, Option<&str>, &str)]) -> PathBuf {
        let slots: Vec<(Key, Slot)> = items
            .iter()
            .map(|(k, v, s)| {
                (
                    k.clone(),
                    Slot {
                        value: v.map(raw),
                        stamp: Arc::new(Stamp::parse(s).unwrap()),
                    },
                )
            })
            .collect();
        let refs: Vec<(&Key, &Slot)> = slots.iter().map(|(k, s)| (k, s)).collect();
        let (h, b) = format::encode_file("log", &refs);
        let p = dir.join(name);
        fs::write(&p, [h, b].concat()).unwrap();
        p
    }

    fn mkfifo(p: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    }

    /// Every kind of hostile entry named like a data file; returns their names.
    fn plant_hostile_files(dir: &Path, outside: &Path) -> Vec<String> {
        use std::os::unix::fs::symlink;
        let names: Vec<String> = (1..=6)
            .map(|i| format!("log-0000000000000000000{i}-evil-1-0.json"))
            .collect();
        mkfifo(&dir.join(&names[0]));
        symlink("/dev/zero", dir.join(&names[1])).unwrap();
        symlink(dir.join("nowhere"), dir.join(&names[2])).unwrap();
        fs::create_dir(dir.join(&names[3])).unwrap();
        fs::File::create(dir.join(&names[4]))
            .unwrap()
            .set_len(8 << 30)
            .unwrap();
        // A valid log outside the folder, linked in.
        let valid = craft(
            outside,
            "log-00000000000000000009-out-1-0.json",
            &[(
                Key::new(66, 66, 0, "outside"),
                Some("\"leak\""),
                "00000000000000000009-out-1-0",
            )],
        );
        assert!(verify_file(&valid).is_ok());
        symlink(&valid, dir.join(&names[5])).unwrap();
        names
    }

    #[test]
    fn hostile_file_types_are_refused_moved_aside_and_never_read() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let idx = d.path().join("idx");
        let mut w = Index::open(&idx, opts()).unwrap();
        w.insert(Key::new(1, 1, 0, "c"), raw("1")).unwrap();
        w.insert(Key::new(2, 2, 0, "c"), raw("2")).unwrap();
        let names = plant_hostile_files(&idx, outside.path());
        let t0 = std::time::Instant::now();
        let mut r = Index::open(&idx, opts()).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(5), "open never blocks");
        assert_eq!(r.len(), 2);
        assert!(
            r.get(&Key::new(66, 66, 0, "outside")).is_none(),
            "symlink not followed"
        );
        let problems = r.take_problems();
        assert_eq!(problems.len(), names.len(), "{problems:#?}");
        for p in &problems {
            assert_eq!(p.kind, ProblemKind::Refused, "{p:?}");
            let aside = p.moved_to.as_ref().expect("moved aside");
            assert!(aside.to_str().unwrap().contains(".corrupt-"));
            assert!(fs::symlink_metadata(aside).is_ok());
        }
        for n in &names {
            assert!(fs::symlink_metadata(idx.join(n)).is_err(), "{n} still there");
        }
        // The outside file is untouched; the index still works.
        assert!(outside
            .path()
            .join("log-00000000000000000009-out-1-0.json")
            .exists());
        r.insert(Key::new(3, 3, 0, "c"), raw("3")).unwrap();
        assert!(r.compact(Some(Duration::from_secs(5))).unwrap());
        assert_eq!(Index::open(&idx, opts()).unwrap().len(), 3);
        assert_eq!(Index::verify(&idx, false).unwrap().1, vec![]);
    }

    #[test]
    fn hostile_files_in_a_read_only_handle_are_skipped_and_reported_once() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let mut w = Index::open(d.path(), opts()).unwrap();
        w.insert(Key::new(1, 1, 0, "c"), raw("1")).unwrap();
        let names = plant_hostile_files(d.path(), outside.path());
        let ro = Options {
            readonly: true,
            ..opts()
        };
        let mut r = Index::open(d.path(), ro).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r.take_problems().len(), names.len());
        r.refresh().unwrap();
        assert!(r.take_problems().is_empty());
        for n in &names {
            assert!(
                fs::symlink_metadata(d.path().join(n)).is_ok(),
                "read-only: left in place"
            );
        }
        // verify reports the same files, and moves them with repair.
        let (good, problems) = Index::verify(d.path(), false).unwrap();
        assert_eq!((good, problems.len()), (1, names.len()));
        assert!(problems.iter().all(|p| p.kind == ProblemKind::Refused));
        let (_, repaired) = Index::verify(d.path(), true).unwrap();
        assert!(repaired.iter().all(|p| p.moved_to.is_some()));
        assert_eq!(Index::verify(d.path(), false).unwrap(), (1, vec![]));
    }

    #[test]
    fn a_dangling_symlink_is_not_taken_for_a_vanishing_file() {
        let d = tempfile::tempdir().unwrap();
        let name = "log-00000000000000000001-x-1-0.json";
        std::os::unix::fs::symlink(d.path().join("gone"), d.path().join(name)).unwrap();
        let ro = Options {
            readonly: true,
            ..opts()
        };
        // Read-only: it cannot be moved, and still every open works.
        for _ in 0..3 {
            let mut r = Index::open(d.path(), ro.clone()).unwrap();
            assert_eq!(r.take_problems().len(), 1);
        }
    }

    #[test]
    fn a_symlinked_index_folder_is_refused() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("real")).unwrap();
        std::os::unix::fs::symlink(d.path().join("real"), d.path().join("idx")).unwrap();
        let err = Index::open(d.path().join("idx"), opts()).unwrap_err();
        assert!(matches!(err, Error::Refused { .. }), "{err}");
        assert_eq!(err.path(), Some(d.path().join("idx").as_path()));
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(Index::verify(&d.path().join("idx"), false).is_err());
        // Dangling: refused too, not replaced by a new folder.
        std::os::unix::fs::symlink(d.path().join("nowhere"), d.path().join("idx2")).unwrap();
        assert!(Index::open(d.path().join("idx2"), opts()).is_err());
        assert!(!d.path().join("nowhere").exists());
    }

    /// Year 5138, in nanoseconds.
    const YEAR_5138: &str = "99985449600000000000";

    #[test]
    fn a_far_future_stamp_does_not_freeze_its_key() {
        let d = tempfile::tempdir().unwrap();
        let k = Key::new(1, 1, 0, "c");
        let other = Key::new(2, 2, 0, "c");
        let fut = format!("{YEAR_5138}-skewed-1-0");
        craft(
            d.path(),
            &format!("log-{fut}.json"),
            &[
                (k.clone(), Some("\"future\""), &fut),
                (other.clone(), Some("\"f2\""), &fut),
            ],
        );
        let mut a = Index::open(d.path(), opts()).unwrap();
        let problems = a.take_problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].kind, ProblemKind::FutureStamp);
        assert!(problems[0].moved_to.is_none());
        assert_eq!(a.get(&k).unwrap().get(), "\"future\"", "valid data is used");
        // A later insert wins, in this handle and in any other.
        a.insert(k.clone(), raw("\"now\"")).unwrap();
        assert_eq!(a.get(&k).unwrap().get(), "\"now\"");
        let mut b = Index::open(d.path(), opts()).unwrap();
        assert_eq!(b.get(&k).unwrap().get(), "\"now\"");
        assert_eq!(b.take_problems().len(), 1, "only the skewed file is reported");
        // remove() really removes, also after compaction.
        assert!(b.remove(other.clone()).unwrap());
        assert!(b.get(&other).is_none());
        assert!(b.compact(Some(Duration::from_secs(5))).unwrap());
        let mut c = Index::open(d.path(), opts()).unwrap();
        assert!(c.get(&other).is_none());
        assert_eq!(c.get(&k).unwrap().get(), "\"now\"");
        assert!(c.take_problems().is_empty(), "nothing skewed is left");
        // A commit of another key is not dragged into the future.
        c.insert(Key::new(3, 3, 0, "c"), raw("3")).unwrap();
        let logs: Vec<String> = data_files(d.path())
            .into_iter()
            .filter(|n| n.starts_with("log-"))
            .collect();
        assert!(logs.iter().all(|n| !n.starts_with("log-9")), "{logs:?}");
        assert_eq!(verify_file(&d.path().join(&logs[0])).unwrap(), 1);
    }

    #[test]
    fn a_stamp_within_the_skew_is_not_reported() {
        let d = tempfile::tempdir().unwrap();
        let soon = format!("{:020}-h-1-0", now_nanos() + 60_000_000_000);
        craft(
            d.path(),
            &format!("log-{soon}.json"),
            &[(Key::new(1, 1, 0, "c"), Some("1"), &soon)],
        );
        let mut a = Index::open(d.path(), opts()).unwrap();
        assert!(a.take_problems().is_empty());
        let strict = Options {
            max_clock_skew: Duration::from_secs(1),
            ..opts()
        };
        assert_eq!(Index::open(d.path(), strict).unwrap().take_problems().len(), 1);
    }

    #[test]
    fn a_malformed_stamp_makes_the_file_corrupt() {
        let d = tempfile::tempdir().unwrap();
        let p = craft(
            d.path(),
            "log-1-h.json",
            &[(Key::new(1, 1, 0, "c"), Some("1"), "00000000000000000001-h-1-0")],
        );
        let text = fs::read_to_string(&p).unwrap();
        let body = text
            .split_once('\n')
            .unwrap()
            .1
            .trim_end()
            .replace("00000000000000000001-h", "~~~~-h");
        let header = format!(
            "FXPIECE-INDEX v1 blake3={} len={}\n",
            crate::hash::to_hex(blake3::hash(body.as_bytes()).as_bytes()),
            body.len()
        );
        fs::write(&p, format!("{header}{body}\n")).unwrap();
        let err = verify_file(&p).unwrap_err();
        assert!(err.to_string().contains("malformed stamp"), "{err}");
    }

    #[test]
    fn too_deep_a_value_is_corrupt_for_verify_and_load_alike() {
        let d = tempfile::tempdir().unwrap();
        let s = "00000000000000000001-h-1-0";
        let ok = format!("{}1{}", "[".repeat(MAX_VALUE_DEPTH), "]".repeat(MAX_VALUE_DEPTH));
        let deep = format!("{}1{}", "[".repeat(129), "]".repeat(129));
        let good = craft(
            d.path(),
            "log-1-h.json",
            &[(Key::new(1, 1, 0, "c"), Some(&ok), s)],
        );
        let bad = craft(
            d.path(),
            "log-2-h.json",
            &[(Key::new(2, 2, 0, "c"), Some(&deep), s)],
        );
        assert!(verify_file(&good).is_ok());
        assert!(matches!(verify_file(&bad), Err(Error::Corrupt { .. })));
        let mut a = Index::open(d.path(), opts()).unwrap();
        let problems = a.take_problems();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].kind, ProblemKind::Corrupt);
        assert!(problems[0].reason.contains("deeper than"), "{problems:?}");
        // What loads can be read back.
        let v: serde_json::Value =
            serde_json::from_str(a.get(&Key::new(1, 1, 0, "c")).unwrap().get()).unwrap();
        assert!(v.is_array());
        assert!(a.get(&Key::new(2, 2, 0, "c")).is_none());
    }
}
