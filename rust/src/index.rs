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
//! * `.tmp-<host>-<pid>-<rand>`: a file being written; never read;
//! * `LOCK`: sidecar lock file, `flock`ed only to keep compactions on one
//!   host from duplicating work (correctness never depends on it);
//! * `<file>.corrupt-<unix seconds>`: a file that failed verification, moved
//!   aside.
//!
//! Every file is written to a temp file in the same folder, fsynced, renamed
//! to its final (unique) name, and the folder is fsynced. A reader therefore
//! sees a file whole or not at all.
//!
//! Every entry carries the stamp of the commit that wrote it: zero-padded
//! nanoseconds, host, pid and random bytes, compared as strings. The state is
//! the per-key maximum over all files (last-writer-wins map): merging is
//! commutative, associative and idempotent, so readers may union files in any
//! order, and two compactions racing on different hosts (where `flock` may be
//! node-local) lose nothing: each writes a snapshot containing everything it
//! read *before* deleting what it read. A reader that finds a listed file gone
//! (compacted away) lists again: the snapshot that absorbed it is then there.
//!
//! A commit writes one small file whatever the size of the index, so its cost
//! does not grow with the index. Compaction rewrites every entry, so it runs
//! only once `max(compact_after, entries / ENTRIES_PER_LOG)` logs have piled
//! up: its cost, linear in the index, is spread over a number of commits that
//! grows as fast, and the amortised cost of a commit stays flat.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::hash::to_hex;

/// Compaction waits for at least one log per this many entries of the index
/// (see the module docs): at 10,000 entries, 312 logs. Smaller would make big
/// indexes compact more often (a commit costs more); larger would leave more
/// small files for a cold reader to open.
pub const ENTRIES_PER_LOG: usize = 32;

/// Format version written in every file header.
pub const FORMAT_VERSION: u32 = 1;
const MAGIC: &str = "FXPIECE-INDEX";
const LOCK_NAME: &str = "LOCK";
const TMP_PREFIX: &str = ".tmp-";

/// A fast, non-cryptographic hasher for the in-memory maps (FxHash with a
/// final avalanche). The keys come from our own files, so there is no
/// hash-flooding adversary to defend against, and SipHash was the largest
/// single cost of loading and compacting a big index.
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_i64(&mut self, i: i64) {
        self.add(i as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // murmur3 fmix64: spread the product's high entropy into the low bits
        // the hash table indexes with.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// `(range_start, range_end, graph_index, compiler)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub start: i64,
    pub end: i64,
    pub graph: i64,
    pub compiler: String,
}

impl Key {
    pub fn new(start: i64, end: i64, graph: i64, compiler: impl Into<String>) -> Self {
        Key {
            start,
            end,
            graph,
            compiler: compiler.into(),
        }
    }
}

/// A stored value: JSON text, kept raw so loading does not build values that
/// nobody looks up.
pub type Value = Box<RawValue>;

#[derive(Debug, Clone)]
struct Slot {
    /// `None` is a removal (tombstone).
    value: Option<Value>,
    stamp: Arc<str>,
}

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
    /// Temp files older than this are removed whatever their owner.
    pub stale_temp_after: Duration,
    /// Never write: no folder created, no temp cleanup, corrupt files are
    /// skipped (not moved aside), commits fail with `EROFS`. For read-only
    /// mounts and deployments that must not touch the cache.
    pub readonly: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host: this_host(),
            use_flock: true,
            compact_after: 64,
            fsync: true,
            stale_temp_after: Duration::from_secs(3600),
            readonly: false,
        }
    }
}

/// What a verification found wrong with one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub reason: String,
    /// Where the file was moved aside to, if it was.
    pub moved_to: Option<PathBuf>,
}

/// A handle on an index folder with an in-memory view of its state.
#[derive(Debug)]
pub struct Index {
    dir: PathBuf,
    opts: Options,
    state: FastMap<Key, Slot>,
    /// Files already merged into `state` (their names), among those last listed.
    seen: HashSet<String>,
    logs_on_disk: usize,
    last_nanos: u64,
    /// Problems found since the caller last drained them.
    problems: Vec<Problem>,
    /// Corrupt files that could not be moved aside (e.g. a read-only
    /// folder): skipped, and reported once per handle rather than on every
    /// refresh.
    unmovable: HashSet<String>,
}

// ----- file format -----------------------------------------------------------

/// A JSON string that borrows from the file when it has no escapes and is
/// owned when it has some: a compiler name may hold quotes, backslashes or
/// control characters, which a plain `&str` cannot be deserialised from.
#[derive(Debug)]
struct Text<'a>(Cow<'a, str>);

impl Serialize for Text<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

#[derive(Serialize, Deserialize)]
struct Body<'a> {
    kind: &'a str,
    #[serde(borrow)]
    stamps: Vec<Text<'a>>,
    #[serde(borrow)]
    entries: Vec<(i64, i64, i64, Text<'a>, &'a RawValue, usize)>,
    #[serde(borrow)]
    removed: Vec<(i64, i64, i64, Text<'a>, usize)>,
}

fn text(s: &str) -> Text<'_> {
    Text(Cow::Borrowed(s))
}

/// Serialise a file: a header line (magic, version, BLAKE3 and length of the
/// body) followed by the JSON body and a newline. Returned as `(header,
/// body)` so a big snapshot is not copied once more to prepend its header.
fn encode_file(kind: &str, items: &[(&Key, &Slot)]) -> (Vec<u8>, Vec<u8>) {
    // Entries of one commit share one `Arc` stamp: dedupe by pointer (cheap)
    // rather than by text. Equal stamps in different `Arc`s are written twice,
    // which the format allows.
    let mut stamp_ids: FastMap<usize, usize> = FastMap::default();
    let mut stamps: Vec<Text<'_>> = Vec::new();
    let mut entries = Vec::with_capacity(items.len());
    let mut removed = Vec::new();
    let mut value_bytes = 0usize;
    for (k, slot) in items {
        let next = stamps.len();
        let id = *stamp_ids
            .entry(Arc::as_ptr(&slot.stamp) as *const u8 as usize)
            .or_insert_with(|| {
                stamps.push(Text(Cow::Borrowed(&slot.stamp)));
                next
            });
        match &slot.value {
            Some(v) => {
                value_bytes += v.get().len() + k.compiler.len();
                entries.push((k.start, k.end, k.graph, text(&k.compiler), &**v, id));
            }
            None => removed.push((k.start, k.end, k.graph, text(&k.compiler), id)),
        }
    }
    let estimate = 64 + value_bytes + 72 * items.len() + 64 * stamps.len();
    let body = Body {
        kind,
        stamps,
        entries,
        removed,
    };
    let mut json = Vec::with_capacity(estimate);
    serde_json::to_writer(&mut json, &body).expect("index bodies always serialise");
    let header = format!(
        "{MAGIC} v{FORMAT_VERSION} blake3={} len={}\n",
        to_hex(blake3::hash(&json).as_bytes()),
        json.len()
    )
    .into_bytes();
    json.push(b'\n');
    (header, json)
}

/// Verify a file's header and checksum; return its JSON body.
pub fn verify_bytes<'a>(path: &Path, data: &'a [u8]) -> Result<&'a [u8]> {
    if data.is_empty() {
        return Err(Error::corrupt(path, "empty file"));
    }
    let nl = data
        .iter()
        .position(|&b| b == b'\n')
        .ok_or_else(|| Error::corrupt(path, "no header line"))?;
    let header = std::str::from_utf8(&data[..nl]).map_err(|_| Error::corrupt(path, "header is not text"))?;
    let mut parts = header.split(' ');
    if parts.next() != Some(MAGIC) {
        return Err(Error::corrupt(path, "not an fxpiece index file (bad magic)"));
    }
    let version = parts.next().unwrap_or("");
    if version != format!("v{FORMAT_VERSION}") {
        return Err(Error::corrupt(
            path,
            format!("unsupported format version {version:?} (this build reads v{FORMAT_VERSION})"),
        ));
    }
    let sum = parts
        .next()
        .and_then(|p| p.strip_prefix("blake3="))
        .ok_or_else(|| Error::corrupt(path, "header has no checksum"))?;
    let len: usize = parts
        .next()
        .and_then(|p| p.strip_prefix("len="))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| Error::corrupt(path, "header has no length"))?;
    let rest = &data[nl + 1..];
    if rest.len() < len {
        return Err(Error::corrupt(
            path,
            format!("truncated: body has {} of {len} bytes", rest.len()),
        ));
    }
    let body = &rest[..len];
    let tail = &rest[len..];
    if !(tail.is_empty() || tail == b"\n") {
        return Err(Error::corrupt(
            path,
            format!("{} unexpected bytes after the {len}-byte body", tail.len()),
        ));
    }
    if to_hex(blake3::hash(body).as_bytes()) != sum {
        return Err(Error::corrupt(path, "checksum mismatch"));
    }
    Ok(body)
}

fn parse_body<'a>(path: &Path, body: &'a [u8]) -> Result<Body<'a>> {
    let parsed: Body<'a> =
        serde_json::from_slice(body).map_err(|e| Error::corrupt(path, format!("bad JSON body: {e}")))?;
    let n = parsed.stamps.len();
    let bad = parsed.entries.iter().any(|e| e.5 >= n) || parsed.removed.iter().any(|r| r.4 >= n);
    if bad {
        return Err(Error::corrupt(path, "entry refers to a missing stamp"));
    }
    Ok(parsed)
}

/// Read and verify one index file without merging it anywhere.
pub fn verify_file(path: &Path) -> Result<usize> {
    let data = fs::read(path).map_err(|e| Error::io("read", path, e))?;
    let body = verify_bytes(path, &data)?;
    let parsed = parse_body(path, body)?;
    Ok(parsed.entries.len() + parsed.removed.len())
}

// ----- small OS helpers --------------------------------------------------------

pub fn this_host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let raw = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".to_owned()
    };
    sanitize_host(&raw)
}

/// Hosts go in file names: keep `[A-Za-z0-9.]` (other bytes become `_`; `-`
/// separates fields).
pub fn sanitize_host(raw: &str) -> String {
    let s: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "unknown".to_owned()
    } else {
        s
    }
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // Fall back on time and address entropy; uniqueness also rests on pid and nanos.
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        return (t as u64) ^ ((&b as *const _ as u64).rotate_left(17));
    }
    u64::from_le_bytes(b)
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence and permission check.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn fsync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| Error::io("open folder", dir, e))?;
    d.sync_all().map_err(|e| Error::io("fsync folder", dir, e))
}

/// Write `data` to `dir/name` atomically: temp file in the same folder, fsync,
/// rename, fsync of the folder. On any failure the temp file is removed and
/// nothing else is touched.
pub fn write_atomic(dir: &Path, name: &str, data: &[u8], host: &str, fsync: bool) -> Result<PathBuf> {
    write_atomic_parts(dir, name, &[data], host, fsync)
}

/// [`write_atomic`] of the concatenation of `parts`.
pub fn write_atomic_parts(
    dir: &Path,
    name: &str,
    parts: &[&[u8]],
    host: &str,
    fsync: bool,
) -> Result<PathBuf> {
    let tmp = dir.join(format!(
        "{TMP_PREFIX}{host}-{}-{:016x}",
        std::process::id(),
        random_u64()
    ));
    let fin = dir.join(name);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(|e| Error::io("create", &tmp, e))?;
        for part in parts {
            f.write_all(part).map_err(|e| Error::io("write", &tmp, e))?;
        }
        if fsync {
            f.sync_all().map_err(|e| Error::io("fsync", &tmp, e))?;
        }
        drop(f);
        fs::rename(&tmp, &fin).map_err(|e| Error::io("rename into place", &fin, e))?;
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
    /// Try to take the lock; with `timeout` `None` do not wait.
    pub fn acquire(path: &Path, timeout: Option<Duration>) -> Result<Option<FileLock>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map_err(|e| Error::io("open lock file", path, e))?;
        let start = Instant::now();
        let mut backoff = Duration::from_micros(200);
        loop {
            // SAFETY: fd is a valid open descriptor owned by `file`.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Ok(Some(FileLock { file }));
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(Error::io("lock", path, err));
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

// ----- the index -------------------------------------------------------------

enum FileKind {
    Log,
    Snap,
}

fn kind_of(name: &str) -> Option<FileKind> {
    if !name.ends_with(".json") {
        return None;
    }
    if name.starts_with("log-") {
        Some(FileKind::Log)
    } else if name.starts_with("snap-") {
        Some(FileKind::Snap)
    } else {
        None
    }
}

struct Listing {
    data_files: Vec<String>,
    temps: Vec<String>,
}

impl Index {
    /// Open (creating the folder if needed) and load the index at `dir`.
    pub fn open(dir: impl Into<PathBuf>, opts: Options) -> Result<Index> {
        let dir = dir.into();
        let mut problems = Vec::new();
        let readonly = opts.readonly;
        match fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) if readonly => problems.push(Problem {
                file: dir.clone(),
                reason: "the index path is a file, not a folder (read-only: left in place)".to_owned(),
                moved_to: None,
            }),
            Err(e) if e.kind() == ErrorKind::NotFound && readonly => {}
            Ok(_) => {
                // Not a folder (e.g. a stray or torn file from another tool): move it aside.
                let aside = aside_name(&dir);
                fs::rename(&dir, &aside).map_err(|e| Error::io("move aside", &dir, e))?;
                create_private_dir(&dir)?;
                problems.push(Problem {
                    file: dir.clone(),
                    reason: "the index path is a file, not a folder".to_owned(),
                    moved_to: Some(aside),
                });
            }
            Err(e) if e.kind() == ErrorKind::NotFound => create_private_dir(&dir)?,
            Err(e) => return Err(Error::io("open folder", &dir, e)),
        }
        let mut idx = Index {
            dir,
            opts,
            state: FastMap::default(),
            seen: HashSet::new(),
            logs_on_disk: 0,
            last_nanos: 0,
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

    /// Problems (corrupt files moved aside) found since the last call.
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

    fn merge(&mut self, key: Key, slot: Slot) {
        use std::collections::hash_map::Entry;
        match self.state.entry(key) {
            Entry::Occupied(mut cur) => {
                if *cur.get().stamp < *slot.stamp {
                    cur.insert(slot);
                }
            }
            Entry::Vacant(v) => {
                v.insert(slot);
            }
        }
    }

    fn merge_body(&mut self, body: Body<'_>) -> Result<()> {
        let stamps: Vec<Arc<str>> = body.stamps.iter().map(|s| Arc::from(&*s.0)).collect();
        // Loading a snapshot into an empty map: size it once, not by doubling.
        self.state
            .reserve((body.entries.len() + body.removed.len()).saturating_sub(self.state.len()));
        for (s, e, g, c, v, i) in body.entries {
            let raw = v.to_owned();
            self.merge(
                Key::new(s, e, g, c.0),
                Slot {
                    value: Some(raw),
                    stamp: stamps[i].clone(),
                },
            );
        }
        for (s, e, g, c, i) in body.removed {
            self.merge(
                Key::new(s, e, g, c.0),
                Slot {
                    value: None,
                    stamp: stamps[i].clone(),
                },
            );
        }
        Ok(())
    }

    fn quarantine(&mut self, name: &str, reason: String) {
        let path = self.dir.join(name);
        if self.opts.readonly {
            if self.unmovable.insert(name.to_owned()) {
                self.problems.push(Problem {
                    file: path,
                    reason,
                    moved_to: None,
                });
            }
            return;
        }
        let aside = aside_name(&path);
        let moved_to = match fs::rename(&path, &aside) {
            Ok(()) => Some(aside),
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
                .filter(|n| matches!(kind_of(n), Some(FileKind::Log)))
                .count();
            let mut vanished = false;
            for name in &listing.data_files {
                if self.seen.contains(name) || self.unmovable.contains(name) {
                    continue;
                }
                let path = self.dir.join(name);
                let data = match fs::read(&path) {
                    Ok(d) => d,
                    Err(e) if e.kind() == ErrorKind::NotFound => {
                        // Compacted away after we listed: the snapshot that
                        // absorbed it exists now; list again.
                        vanished = true;
                        continue;
                    }
                    Err(e) => return Err(Error::io("read", &path, e)),
                };
                let parsed = verify_bytes(&path, &data).and_then(|b| parse_body(&path, b));
                match parsed {
                    Ok(body) => {
                        self.merge_body(body)?;
                        self.seen.insert(name.clone());
                    }
                    Err(Error::Corrupt { reason, .. }) => self.quarantine(name, reason),
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

    /// Remove temp files left by dead writers: those of this host whose pid is
    /// gone, and any older than `stale_temp_after`.
    fn clean_temps(&self, temps: &[String]) {
        for name in temps {
            let rest = &name[TMP_PREFIX.len()..];
            let mut fields = rest.rsplitn(3, '-');
            let _rand = fields.next();
            let pid: Option<i32> = fields.next().and_then(|p| p.parse().ok());
            let host = fields.next();
            let path = self.dir.join(name);
            let dead_here = host == Some(self.opts.host.as_str()) && pid.is_some_and(|p| !pid_alive(p));
            let stale = fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= self.opts.stale_temp_after);
            if dead_here || stale {
                let _ = fs::remove_file(&path);
            }
        }
    }

    fn next_stamp(&mut self) -> Arc<str> {
        let n = now_nanos().max(self.last_nanos + 1);
        self.last_nanos = n;
        Arc::from(format!(
            "{n:020}-{}-{}-{:016x}",
            self.opts.host,
            std::process::id(),
            random_u64()
        ))
    }

    pub fn get(&self, key: &Key) -> Option<&RawValue> {
        self.state.get(key).and_then(|s| s.value.as_deref())
    }

    pub fn len(&self) -> usize {
        self.state.values().filter(|s| s.value.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

    /// Commit a batch of puts (`Some`) and removals (`None`) as one durable,
    /// atomic file. Returns once the commit is on disk.
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

    pub fn commit(&mut self, ops: Vec<(Key, Option<Value>)>) -> Result<()> {
        self.check_writable()?;
        if ops.is_empty() {
            return Ok(());
        }
        let stamp = self.next_stamp();
        let slots: Vec<(Key, Slot)> = ops
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    Slot {
                        value: v,
                        stamp: stamp.clone(),
                    },
                )
            })
            .collect();
        let items: Vec<(&Key, &Slot)> = slots.iter().map(|(k, s)| (k, s)).collect();
        let (header, body) = encode_file("log", &items);
        let name = format!("log-{stamp}.json");
        write_atomic_parts(
            &self.dir,
            &name,
            &[&header, &body],
            &self.opts.host,
            self.opts.fsync,
        )?;
        self.seen.insert(name);
        self.logs_on_disk += 1;
        for (k, s) in slots {
            self.merge(k, s);
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
        self.opts.compact_after.max(self.state.len() / ENTRIES_PER_LOG)
    }

    fn auto_compact(&mut self) -> Result<()> {
        // Count what is really there (other writers' logs included) before paying for it.
        let listing = self.list()?;
        self.logs_on_disk = listing
            .data_files
            .iter()
            .filter(|n| matches!(kind_of(n), Some(FileKind::Log)))
            .count();
        if self.logs_on_disk >= self.compact_threshold() {
            self.compact(None)?;
        }
        Ok(())
    }

    pub fn insert(&mut self, key: Key, value: Value) -> Result<()> {
        self.commit(vec![(key, Some(value))])
    }

    pub fn remove(&mut self, key: Key) -> Result<bool> {
        let had = self.get(&key).is_some();
        self.commit(vec![(key, None)])?;
        Ok(had)
    }

    /// Merge every file into one snapshot and delete the files it absorbed.
    /// With `wait` `None`, skip (return `false`) if another process on this
    /// host is compacting; otherwise wait up to `wait` for it.
    pub fn compact(&mut self, wait: Option<Duration>) -> Result<bool> {
        self.check_writable()?;
        let _lock = if self.opts.use_flock {
            match FileLock::acquire(&self.dir.join(LOCK_NAME), wait)? {
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
        let stamp = self.next_stamp();
        let mut items: Vec<(&Key, &Slot)> = self.state.iter().collect();
        items.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let (header, body) = encode_file("snapshot", &items);
        drop(items);
        let name = format!("snap-{stamp}.json");
        write_atomic_parts(
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

    /// Check every file of the index; with `repair`, move bad ones aside.
    pub fn verify(dir: &Path, repair: bool) -> Result<(usize, Vec<Problem>)> {
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
            match verify_file(&path) {
                Ok(_) => ok += 1,
                Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {}
                Err(Error::Corrupt { reason, .. }) => {
                    let moved_to = if repair {
                        let aside = aside_name(&path);
                        fs::rename(&path, &aside).ok().map(|_| aside)
                    } else {
                        None
                    };
                    problems.push(Problem {
                        file: path,
                        reason,
                        moved_to,
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Ok((ok, problems))
    }
}

/// Create `dir` and any missing parents, each private to the user (0700).
fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io("create folder", dir, e))
}

fn aside_name(path: &Path) -> PathBuf {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".corrupt-{secs}"));
    let mut p = PathBuf::from(s);
    let mut n = 1;
    while p.exists() {
        let mut s = path.as_os_str().to_owned();
        s.push(format!(".corrupt-{secs}.{n}"));
        p = PathBuf::from(s);
        n += 1;
    }
    p
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
            stamp: Arc::from("00000000000000000001-h-1-0"),
        };
        a.merge(k.clone(), old);
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
        let host = this_host();
        // pid 2^22+ is above pid_max defaults: dead.
        let dead = d.path().join(format!(".tmp-{host}-4999999-00000000deadbeef"));
        fs::write(&dead, b"half").unwrap();
        let other = d.path().join(".tmp-otherhost-1-00000000deadbeef");
        fs::write(&other, b"half").unwrap();
        let live = d
            .path()
            .join(format!(".tmp-{host}-{}-00000000deadbeef", std::process::id()));
        fs::write(&live, b"half").unwrap();
        let _ = Index::open(d.path(), opts()).unwrap();
        assert!(!dead.exists());
        assert!(other.exists(), "fresh temp of another host is left alone");
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

    #[test]
    fn write_atomic_leaves_no_temp_on_failure() {
        let d = tempfile::tempdir().unwrap();
        // Renaming onto an existing non-empty folder fails.
        fs::create_dir(d.path().join("target")).unwrap();
        fs::write(d.path().join("target").join("x"), b"x").unwrap();
        let err = write_atomic(d.path(), "target", b"data", "h", false).unwrap_err();
        assert!(matches!(err, Error::Io { .. }));
        let names = data_files(d.path());
        assert_eq!(names, vec!["target".to_owned()]);
    }
}
