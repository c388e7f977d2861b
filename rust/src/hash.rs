//! BLAKE3 hashing of cache-key inputs: sets of source files and JSON-like
//! factor values.
//!
//! Both digests are domain-separated and framed so that no two different
//! inputs share an encoding:
//!
//! * files: the set of paths (sorted, deduplicated) is hashed as a sequence of
//!   frames `tag | len(path) | path | len(content) | blake3(content)`; a file
//!   that cannot be read contributes a `missing` frame with its path only, so
//!   the digest stays deterministic and still depends on which paths were
//!   asked for.
//! * factors: a tagged, length-prefixed canonical encoding in which every
//!   type has its own tag and dict entries are sorted by their encoded key.
//!   Integers are their decimal text when they fit in i64, else `0x`/`-0x`
//!   hex (the Python glue does this; either way one value has one text).

use rayon::prelude::*;

const FILES_DOMAIN: &[u8] = b"fxpiece.hash_files.v1\0";
const FACTORS_DOMAIN: &[u8] = b"fxpiece.hash_factors.v1\0";

/// Outcome of hashing one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOutcome {
    /// The file was read: its size and the BLAKE3 digest of its bytes.
    Read { size: u64, digest: [u8; 32] },
    /// The file could not be read (missing, a pseudo-path, a directory...).
    Skipped { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    pub path: String,
    pub outcome: FileOutcome,
}

/// The digest over a set of files, with the per-file results it was made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesHash {
    pub digest: [u8; 32],
    /// One entry per distinct path, sorted by path.
    pub files: Vec<FileDigest>,
}

impl FilesHash {
    pub fn hex(&self) -> String {
        to_hex(&self.digest)
    }

    pub fn total_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|f| match f.outcome {
                FileOutcome::Read { size, .. } => size,
                FileOutcome::Skipped { .. } => 0,
            })
            .sum()
    }

    pub fn skipped(&self) -> impl Iterator<Item = (&str, &str)> {
        self.files.iter().filter_map(|f| match &f.outcome {
            FileOutcome::Skipped { reason } => Some((f.path.as_str(), reason.as_str())),
            FileOutcome::Read { .. } => None,
        })
    }
}

pub fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

/// Bytes read per `read` call: large enough for BLAKE3's widest SIMD batch,
/// small enough that the chunk is still in cache when it is hashed.
const READ_CHUNK: usize = 64 * 1024;

thread_local! {
    /// One reusable read buffer per rayon worker: no allocation (and no
    /// page-faulting of fresh memory) per file.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn hash_one(path: &str) -> FileOutcome {
    use std::io::Read;
    let skipped = |e: std::io::Error| FileOutcome::Skipped {
        reason: e.to_string(),
    };
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return skipped(e),
    };
    READ_BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() != READ_CHUNK {
            buf.resize(READ_CHUNK, 0);
        }
        let mut hasher = blake3::Hasher::new();
        let mut size = 0u64;
        loop {
            match file.read(&mut buf[..]) {
                Ok(0) => break,
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    size += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // E.g. EISDIR: a folder opens but does not read.
                Err(e) => return skipped(e),
            }
        }
        FileOutcome::Read {
            size,
            digest: *hasher.finalize().as_bytes(),
        }
    })
}

/// Frames of the file-set digest, in order. Public for the tests that prove
/// the framing is injective.
pub fn frame_file(out: &mut Vec<u8>, f: &FileDigest) {
    match &f.outcome {
        FileOutcome::Read { size, digest } => {
            out.push(b'F');
            put_bytes(out, f.path.as_bytes());
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(digest);
        }
        FileOutcome::Skipped { .. } => {
            out.push(b'M');
            put_bytes(out, f.path.as_bytes());
        }
    }
}

/// Hash a set of files, reading them in parallel. Order and duplicates in
/// `paths` do not matter.
pub fn hash_files<S: AsRef<str> + Sync>(paths: &[S]) -> FilesHash {
    let mut unique: Vec<&str> = paths.iter().map(|p| p.as_ref()).collect();
    unique.sort_unstable();
    unique.dedup();
    let files: Vec<FileDigest> = unique
        .par_iter()
        .map(|p| FileDigest {
            path: (*p).to_owned(),
            outcome: hash_one(p),
        })
        .collect();
    let mut hasher = blake3::Hasher::new();
    hasher.update(FILES_DOMAIN);
    hasher.update(&(files.len() as u64).to_le_bytes());
    let mut frame = Vec::with_capacity(256);
    for f in &files {
        frame.clear();
        frame_file(&mut frame, f);
        hasher.update(&frame);
    }
    FilesHash {
        digest: *hasher.finalize().as_bytes(),
        files,
    }
}

/// A JSON-like value, as hashed by [`hash_factors`].
#[derive(Debug, Clone, PartialEq)]
pub enum Factor {
    None,
    Bool(bool),
    /// Integers of any size, as their canonical decimal text.
    Int(String),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Factor>),
    Tuple(Vec<Factor>),
    Dict(Vec<(Factor, Factor)>),
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u64).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_len(out, b.len());
    out.extend_from_slice(b);
}

/// Append the canonical encoding of `v` to `out`.
pub fn encode_factor(out: &mut Vec<u8>, v: &Factor) {
    match v {
        Factor::None => out.push(b'N'),
        Factor::Bool(true) => out.push(b'T'),
        Factor::Bool(false) => out.push(b'F'),
        Factor::Int(digits) => {
            out.push(b'I');
            put_bytes(out, digits.as_bytes());
        }
        Factor::Float(x) => {
            out.push(b'D');
            // Equal floats encode equal: -0.0 == 0.0, and every NaN is one NaN.
            let canon = if *x == 0.0 {
                0.0f64
            } else if x.is_nan() {
                f64::NAN
            } else {
                *x
            };
            out.extend_from_slice(&canon.to_bits().to_le_bytes());
        }
        Factor::Str(s) => {
            out.push(b'S');
            put_bytes(out, s.as_bytes());
        }
        Factor::Bytes(b) => {
            out.push(b'B');
            put_bytes(out, b);
        }
        Factor::List(items) | Factor::Tuple(items) => {
            out.push(if matches!(v, Factor::List(_)) { b'L' } else { b'U' });
            put_len(out, items.len());
            for item in items {
                encode_factor(out, item);
            }
        }
        Factor::Dict(entries) => {
            out.push(b'M');
            put_len(out, entries.len());
            let mut encoded: Vec<(Vec<u8>, &Factor)> = entries
                .iter()
                .map(|(k, val)| {
                    let mut kb = Vec::new();
                    encode_factor(&mut kb, k);
                    (kb, val)
                })
                .collect();
            encoded.sort_by(|a, b| a.0.cmp(&b.0));
            for (kb, val) in encoded {
                out.extend_from_slice(&kb);
                encode_factor(out, val);
            }
        }
    }
}

/// BLAKE3 (hex) of the canonical encoding of `v`.
pub fn hash_factors(v: &Factor) -> String {
    let mut buf = Vec::with_capacity(1024);
    buf.extend_from_slice(FACTORS_DOMAIN);
    encode_factor(&mut buf, v);
    to_hex(blake3::hash(&buf).as_bytes())
}

/// The raw BLAKE3 of `b` as a bytes factor: equal to the digest behind
/// `hash_factors(&Factor::Bytes(b.to_vec()))`, streamed over the borrowed
/// slice (no copy; multithreaded above 128 KiB), so checking a large
/// artifact needs no memory beyond the artifact itself.
pub fn checksum_raw(b: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(FACTORS_DOMAIN);
    h.update(b"B");
    h.update(&(b.len() as u64).to_le_bytes());
    if b.len() > (128 << 10) {
        h.update_rayon(b);
    } else {
        h.update(b);
    }
    *h.finalize().as_bytes()
}

/// [`checksum_raw`] as hex: an artifact's checksum.
pub fn checksum_bytes(b: &[u8]) -> String {
    to_hex(&checksum_raw(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(dir: &std::path::Path, name: &str, content: &[u8]) -> String {
        let p = dir.join(name);
        std::fs::File::create(&p).unwrap().write_all(content).unwrap();
        p.to_str().unwrap().to_owned()
    }

    #[test]
    fn files_digest_is_order_and_duplicate_independent() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.py", b"x = 1\n");
        let b = write(d.path(), "b.py", b"y = 2\n");
        let h1 = hash_files(&[a.clone(), b.clone()]);
        let h2 = hash_files(&[b.clone(), a.clone(), b.clone()]);
        assert_eq!(h1.digest, h2.digest);
        assert_eq!(h1.files.len(), 2);
        assert_eq!(h1.total_bytes(), 12);
    }

    #[test]
    fn moving_bytes_between_files_changes_digest() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a", b"ab");
        let b = write(d.path(), "b", b"c");
        let h1 = hash_files(&[a.clone(), b.clone()]);
        write(d.path(), "a", b"a");
        write(d.path(), "b", b"bc");
        let h2 = hash_files(&[a, b]);
        assert_ne!(h1.digest, h2.digest);
    }

    #[test]
    fn framing_separates_path_from_content() {
        // Path "ab" + content "c" must not frame like path "a" + content "bc".
        let f1 = FileDigest {
            path: "ab".into(),
            outcome: FileOutcome::Read {
                size: 1,
                digest: *blake3::hash(b"c").as_bytes(),
            },
        };
        let f2 = FileDigest {
            path: "a".into(),
            outcome: FileOutcome::Read {
                size: 2,
                digest: *blake3::hash(b"bc").as_bytes(),
            },
        };
        let (mut e1, mut e2) = (Vec::new(), Vec::new());
        frame_file(&mut e1, &f1);
        frame_file(&mut e2, &f2);
        assert_ne!(e1, e2);
        // A missing file never frames like a present one with the same path.
        let m = FileDigest {
            path: "ab".into(),
            outcome: FileOutcome::Skipped { reason: "x".into() },
        };
        let mut e3 = Vec::new();
        frame_file(&mut e3, &m);
        assert_ne!(e1[..e3.len().min(e1.len())], e3[..]);
    }

    #[test]
    fn unreadable_files_are_skipped_deterministically() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.py", b"x");
        let paths = vec![a.clone(), "<frozen posixpath>".to_owned(), "<string>".to_owned()];
        let h1 = hash_files(&paths);
        let h2 = hash_files(&paths);
        assert_eq!(h1.digest, h2.digest);
        let skipped: Vec<&str> = h1.skipped().map(|(p, _)| p).collect();
        assert_eq!(skipped, vec!["<frozen posixpath>", "<string>"]);
        // The set of asked-for paths still matters.
        assert_ne!(h1.digest, hash_files(&[a]).digest);
    }

    #[test]
    fn streamed_digest_equals_one_shot_digest() {
        let d = tempfile::tempdir().unwrap();
        // Several read chunks plus a partial one.
        let big: Vec<u8> = (0..(3 * READ_CHUNK + 123)).map(|i| (i * 7 % 251) as u8).collect();
        let p = write(d.path(), "big.bin", &big);
        let e = write(d.path(), "empty", b"");
        let h = hash_files(&[p, e]);
        assert_eq!(
            h.files[0].outcome,
            FileOutcome::Read {
                size: big.len() as u64,
                digest: *blake3::hash(&big).as_bytes()
            }
        );
        assert_eq!(
            h.files[1].outcome,
            FileOutcome::Read {
                size: 0,
                digest: *blake3::hash(b"").as_bytes()
            }
        );
        // A folder opens but does not read: skipped.
        let dir = d.path().to_str().unwrap().to_owned();
        assert!(matches!(
            hash_files(&[dir]).files[0].outcome,
            FileOutcome::Skipped { .. }
        ));
    }

    #[test]
    fn content_change_changes_digest() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.py", b"x = 1");
        let h1 = hash_files(std::slice::from_ref(&a));
        write(d.path(), "a.py", b"x = 2");
        assert_ne!(h1.digest, hash_files(&[a]).digest);
    }

    fn s(x: &str) -> Factor {
        Factor::Str(x.into())
    }

    #[test]
    fn canonical_encoding_distinguishes_types() {
        let one_int = Factor::Dict(vec![(s("a"), Factor::Int("1".into()))]);
        let one_str = Factor::Dict(vec![(s("a"), s("1"))]);
        let one_float = Factor::Dict(vec![(s("a"), Factor::Float(1.0))]);
        let one_bool = Factor::Dict(vec![(s("a"), Factor::Bool(true))]);
        let hs: Vec<String> = [one_int, one_str, one_float, one_bool]
            .iter()
            .map(hash_factors)
            .collect();
        for i in 0..hs.len() {
            for j in i + 1..hs.len() {
                assert_ne!(hs[i], hs[j]);
            }
        }
        let l = Factor::List(vec![Factor::Int("1".into())]);
        let t = Factor::Tuple(vec![Factor::Int("1".into())]);
        assert_ne!(hash_factors(&l), hash_factors(&t));
        assert_ne!(hash_factors(&Factor::None), hash_factors(&s("")));
    }

    #[test]
    fn canonical_encoding_sorts_dict_keys() {
        let d1 = Factor::Dict(vec![
            (s("b"), Factor::Int("2".into())),
            (s("a"), Factor::Int("1".into())),
        ]);
        let d2 = Factor::Dict(vec![
            (s("a"), Factor::Int("1".into())),
            (s("b"), Factor::Int("2".into())),
        ]);
        assert_eq!(hash_factors(&d1), hash_factors(&d2));
    }

    #[test]
    fn canonical_encoding_nesting_is_unambiguous() {
        // ["ab"] vs ["a", "b"] and [[1], 2] vs [[1, 2]]
        let a = Factor::List(vec![s("ab")]);
        let b = Factor::List(vec![s("a"), s("b")]);
        assert_ne!(hash_factors(&a), hash_factors(&b));
        let one = || Factor::Int("1".into());
        let two = || Factor::Int("2".into());
        let c = Factor::List(vec![Factor::List(vec![one()]), two()]);
        let d = Factor::List(vec![Factor::List(vec![one(), two()])]);
        assert_ne!(hash_factors(&c), hash_factors(&d));
    }

    #[test]
    fn equal_floats_hash_equal() {
        assert_eq!(
            hash_factors(&Factor::Float(0.0)),
            hash_factors(&Factor::Float(-0.0))
        );
        assert_eq!(
            hash_factors(&Factor::Float(f64::NAN)),
            hash_factors(&Factor::Float(-f64::NAN))
        );
        assert_ne!(
            hash_factors(&Factor::Float(1.0)),
            hash_factors(&Factor::Float(1.0000000001))
        );
    }

    #[test]
    fn hex_is_64_lowercase_chars() {
        let h = hash_factors(&Factor::None);
        assert_eq!(h.len(), 64);
        assert!(h
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }

    #[test]
    fn streamed_bytes_checksum_equals_bytes_factor() {
        for n in [0usize, 1, 1000, (128 << 10) + 7, 3 << 20] {
            let b: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
            assert_eq!(
                checksum_bytes(&b),
                hash_factors(&Factor::Bytes(b.clone())),
                "n={n}"
            );
        }
        assert_ne!(checksum_bytes(b"a"), checksum_bytes(b"b"));
    }
}
