//! The on-disk format of index files: file names, the header line, the
//! checksummed JSON body, and its verification.
//!
//! Every file is a header line `FXPIECE-INDEX v1 blake3=<hex> len=<n>`
//! followed by the JSON body and a newline. A file is accepted only whole:
//! header, version, length, checksum, JSON shape, stamp syntax, stamp
//! references and value nesting (at most [`MAX_VALUE_DEPTH`] levels, so
//! that everything accepted here can be read back by `get`) must all check
//! out; anything else is [`Error::Corrupt`].

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use super::state::{FastMap, Key, Slot, Stamp};
use crate::error::{Error, Result};
use crate::fsutil::{self, DEFAULT_MAX_FILE_BYTES};
use crate::hash::to_hex;

/// Format version written in every file header.
pub const FORMAT_VERSION: u32 = 1;
const MAGIC: &str = "FXPIECE-INDEX";

/// Deepest nesting of arrays and objects in a stored value. Writers refuse
/// deeper values; a file holding one is corrupt (reading it back would hit
/// serde_json's recursion limit of 128).
pub const MAX_VALUE_DEPTH: usize = 100;

/// The two kinds of data file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Log,
    Snap,
}

/// The kind of a data file, by its name (`log-*.json`, `snap-*.json`).
pub fn kind_of(name: &str) -> Option<FileKind> {
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

/// A JSON string that borrows from the file when it has no escapes and is
/// owned when it has some: a compiler name may hold quotes, backslashes or
/// control characters, which a plain `&str` cannot be deserialised from.
#[derive(Debug)]
pub struct Text<'a>(pub Cow<'a, str>);

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

/// A file's JSON body. Entries and removals refer to `stamps` by index.
#[derive(Serialize, Deserialize)]
pub struct Body<'a> {
    pub kind: &'a str,
    #[serde(borrow)]
    pub stamps: Vec<Text<'a>>,
    #[serde(borrow)]
    pub entries: Vec<(i64, i64, i64, Text<'a>, &'a RawValue, usize)>,
    #[serde(borrow)]
    pub removed: Vec<(i64, i64, i64, Text<'a>, usize)>,
}

fn text(s: &str) -> Text<'_> {
    Text(Cow::Borrowed(s))
}

/// Serialise a file: a header line (magic, version, BLAKE3 and length of the
/// body) followed by the JSON body and a newline. Returned as `(header,
/// body)` so a big snapshot is not copied once more to prepend its header.
pub fn encode_file(kind: &str, items: &[(&Key, &Slot)]) -> (Vec<u8>, Vec<u8>) {
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
            .entry(Arc::as_ptr(&slot.stamp) as usize)
            .or_insert_with(|| {
                stamps.push(text(&slot.stamp.text));
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

/// Whether valid JSON text nests arrays and objects deeper than `limit`.
pub fn nests_deeper_than(json: &[u8], limit: usize) -> bool {
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    for &b in json {
        if in_str {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_str = false;
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Parse a verified body and check what the checksum cannot: stamp syntax,
/// stamp references and value nesting. Returns the body and its stamps.
pub fn parse_body<'a>(path: &Path, body: &'a [u8]) -> Result<(Body<'a>, Vec<Arc<Stamp>>)> {
    let parsed: Body<'a> =
        serde_json::from_slice(body).map_err(|e| Error::corrupt(path, format!("bad JSON body: {e}")))?;
    let stamps = parsed
        .stamps
        .iter()
        .map(|s| {
            Stamp::parse(&s.0)
                .map(Arc::new)
                .ok_or_else(|| Error::corrupt(path, format!("malformed stamp {:?}", s.0)))
        })
        .collect::<Result<Vec<_>>>()?;
    let n = stamps.len();
    let bad = parsed.entries.iter().any(|e| e.5 >= n) || parsed.removed.iter().any(|r| r.4 >= n);
    if bad {
        return Err(Error::corrupt(path, "entry refers to a missing stamp"));
    }
    if let Some(e) = parsed
        .entries
        .iter()
        .find(|e| nests_deeper_than(e.4.get().as_bytes(), MAX_VALUE_DEPTH))
    {
        return Err(Error::corrupt(
            path,
            format!(
                "the value of ({}, {}, {}, {:?}) nests deeper than {MAX_VALUE_DEPTH} levels",
                e.0, e.1, e.2, e.3 .0
            ),
        ));
    }
    Ok((parsed, stamps))
}

/// Read (with [`fsutil::read_regular_file`]: no symlink, FIFO, device or
/// folder, at most `max_bytes`) and verify one index file without merging
/// it anywhere; returns its number of records.
pub fn verify_file_capped(path: &Path, max_bytes: u64) -> Result<usize> {
    let data = fsutil::read_regular_file(path, max_bytes)?;
    let body = verify_bytes(path, &data)?;
    let (parsed, _) = parse_body(path, body)?;
    Ok(parsed.entries.len() + parsed.removed.len())
}

/// [`verify_file_capped`] with the default size cap.
pub fn verify_file(path: &Path) -> Result<usize> {
    verify_file_capped(path, DEFAULT_MAX_FILE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_depth_ignores_brackets_in_strings() {
        assert!(!nests_deeper_than(br#"[[1]]"#, 2));
        assert!(nests_deeper_than(br#"[[[1]]]"#, 2));
        assert!(!nests_deeper_than(br#"["[[[[\"[[[", {"a": "{{{{"}]"#, 2));
        let deep = format!("{}{}", "[".repeat(101), "]".repeat(101));
        assert!(nests_deeper_than(deep.as_bytes(), MAX_VALUE_DEPTH));
        let ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(!nests_deeper_than(ok.as_bytes(), MAX_VALUE_DEPTH));
    }

    #[test]
    fn file_names_have_kinds() {
        assert_eq!(kind_of("log-1-h.json"), Some(FileKind::Log));
        assert_eq!(kind_of("snap-1-h.json"), Some(FileKind::Snap));
        assert_eq!(kind_of("log-1-h.json.corrupt-5"), None);
        assert_eq!(kind_of("LOCK"), None);
    }
}
