//! The in-memory state of an index: keys, stored values, commit stamps and
//! the last-writer-wins merge.
//!
//! # Stamps and clocks
//!
//! Every entry carries the stamp of the commit that wrote it:
//! `<nanoseconds>-<host>-<pid>-<random>`, ordered by the nanoseconds as a
//! number and then by the whole text (so equal times still order the same
//! way everywhere). The state is, per key, the entry with the greatest stamp:
//! a merge that is commutative, associative and idempotent.
//!
//! Stamps are a *hybrid logical clock* per key: a writer stamps a commit
//! `max(now, its previous stamp + 1)`, and an entry whose key already holds
//! a stamp at or past that gets `that stamp + 1` instead ([`Clock::after`],
//! marked `-hlc`). So an insert or removal made after seeing an entry always
//! supersedes it, even when that entry was stamped by a clock far in the
//! future (a host whose clock said year 5138): it no longer freezes its key.
//! Such stamps are valid (they were checksummed by whoever wrote them) and
//! are ordered as stamped; readers report stamps more than the allowed skew
//! past their own clock (see `Options::max_clock_skew`), except `-hlc` ones,
//! which are this rule at work. The nanoseconds field is parsed as up to 30
//! digits (u128), so `+ 1` never overflows and a 21-digit stamp still sorts
//! after a 20-digit one.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::value::RawValue;

use crate::proc::random_u64;

/// A fast, non-cryptographic hasher for the in-memory maps (FxHash with a
/// final avalanche). The keys come from our own files, so there is no
/// hash-flooding adversary to defend against, and SipHash was the largest
/// single cost of loading and compacting a big index.
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

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

pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

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

/// Suffix of stamps made by [`Clock::after`].
pub const HLC_MARK: &str = "-hlc";
/// Most digits of a stamp's nanoseconds field.
const MAX_NANOS_DIGITS: usize = 30;

/// A commit stamp: its text as written, and its nanoseconds parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub nanos: u128,
    pub text: Box<str>,
}

impl Stamp {
    /// Parse a stamp: 1 to 30 ASCII digits, `-`, then at least one byte.
    pub fn parse(text: &str) -> Option<Stamp> {
        let (digits, rest) = text.split_once('-')?;
        if digits.is_empty()
            || digits.len() > MAX_NANOS_DIGITS
            || rest.is_empty()
            || !digits.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        Some(Stamp {
            nanos: digits.parse().ok()?,
            text: text.into(),
        })
    }

    /// Made by the per-key clock rule, not by a wall clock.
    pub fn is_logical(&self) -> bool {
        self.text.ends_with(HLC_MARK)
    }
}

impl PartialOrd for Stamp {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Stamp {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.nanos, &*self.text).cmp(&(other.nanos, &*other.text))
    }
}

#[derive(Debug, Clone)]
pub struct Slot {
    /// `None` is a removal (tombstone).
    pub value: Option<Value>,
    pub stamp: Arc<Stamp>,
}

/// Wall-clock nanoseconds since the epoch.
pub fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// A writer's clock: stamps of one handle only grow.
#[derive(Debug, Default)]
pub struct Clock {
    last_nanos: u128,
}

impl Clock {
    /// The stamp of a new commit: `max(now, last + 1)`.
    pub fn next(&mut self, host: &str) -> Arc<Stamp> {
        let n = now_nanos().max(self.last_nanos + 1);
        self.last_nanos = n;
        Arc::new(Stamp {
            nanos: n,
            text: format!("{n:020}-{host}-{}-{:016x}", std::process::id(), random_u64()).into(),
        })
    }

    /// The stamp of an entry that must supersede `prev` (its key's current
    /// stamp, at or past the commit's): `prev + 1`. Does not move this
    /// clock, so one far-future entry does not drag the writer's other
    /// commits into the future.
    pub fn after(&self, prev: &Stamp, host: &str) -> Arc<Stamp> {
        let n = prev.nanos + 1;
        Arc::new(Stamp {
            nanos: n,
            text: format!(
                "{n:020}-{host}-{}-{:016x}{HLC_MARK}",
                std::process::id(),
                random_u64()
            )
            .into(),
        })
    }
}

/// The per-key last-writer-wins map.
#[derive(Debug, Default)]
pub struct State {
    map: FastMap<Key, Slot>,
}

impl State {
    /// Keep whichever of the current and `slot` has the greater stamp.
    pub fn merge(&mut self, key: Key, slot: Slot) {
        use std::collections::hash_map::Entry;
        match self.map.entry(key) {
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

    pub fn reserve(&mut self, additional: usize) {
        self.map.reserve(additional);
    }

    pub fn get(&self, key: &Key) -> Option<&RawValue> {
        self.map.get(key).and_then(|s| s.value.as_deref())
    }

    /// The stamp the key currently holds (a removal's too).
    pub fn stamp_of(&self, key: &Key) -> Option<&Arc<Stamp>> {
        self.map.get(key).map(|s| &s.stamp)
    }

    /// Keys held, removals included.
    pub fn slots(&self) -> usize {
        self.map.len()
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.map.values().filter(|s| s.value.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Slot)> {
        self.map.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(v: &str, stamp: &str) -> Slot {
        Slot {
            value: Some(RawValue::from_string(v.to_owned()).unwrap()),
            stamp: Arc::new(Stamp::parse(stamp).unwrap()),
        }
    }

    #[test]
    fn stamps_parse_strictly_and_order_by_number() {
        for bad in [
            "",
            "-h",
            "12",
            "12-",
            "x1-h",
            "1x-h",
            &format!("{}-h", "9".repeat(31)),
        ] {
            assert!(Stamp::parse(bad).is_none(), "{bad:?}");
        }
        let a = Stamp::parse("99999999999999999999-h-1-0").unwrap();
        let b = Stamp::parse("100000000000000000000-h-1-0").unwrap();
        assert!(a < b, "numeric, not lexicographic");
        let c = Stamp::parse("00000000000000000005-a").unwrap();
        let d = Stamp::parse("00000000000000000005-b").unwrap();
        assert!(c < d);
    }

    #[test]
    fn merge_is_last_writer_wins_and_order_free() {
        let k = Key::new(1, 1, 0, "c");
        let slots = [
            slot("1", "00000000000000000001-h-1-0"),
            slot("3", "00000000000000000003-h-1-0"),
            slot("2", "00000000000000000002-h-1-0"),
        ];
        for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2], [2, 0, 1]] {
            let mut s = State::default();
            for i in order {
                s.merge(k.clone(), slots[i].clone());
                s.merge(k.clone(), slots[i].clone()); // idempotent
            }
            assert_eq!(s.get(&k).unwrap().get(), "3");
        }
    }

    #[test]
    fn clock_after_supersedes_a_far_future_stamp_without_moving_the_clock() {
        let mut c = Clock::default();
        let first = c.next("h");
        let future = Stamp::parse("99999999999999999999-x-1-0").unwrap();
        let bumped = c.after(&future, "h");
        assert!(*bumped > future && bumped.is_logical());
        assert_eq!(bumped.nanos, future.nanos + 1);
        let second = c.next("h");
        assert!(second > first && second.nanos < future.nanos && !second.is_logical());
    }
}
