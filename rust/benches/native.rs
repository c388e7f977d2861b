//! Criterion benches of the native core (`cargo bench`).
//!
//! * `hash_files/500_small_files`: one digest over ~500 files of 1-8 KiB in a
//!   temp folder (page cache warm after the first iteration);
//! * `hash_factors/nested`: the canonical encoding + BLAKE3 of a nested,
//!   config-like value;
//! * `index_commit/{100,10000}`: one single-entry commit on an index of that
//!   many entries, fsync off and on tmpfs (`/dev/shm`) when there is one, to
//!   isolate CPU from the disk; compaction amortised in (default options: it
//!   runs every `max(64, entries / 32)` commits). Keys are overwritten
//!   round-robin so the index keeps its size.

use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fxpiece_native::hash::{hash_factors, hash_files, Factor};
use fxpiece_native::index::{Index, Key, Options, Value};
use serde_json::value::RawValue;

fn raw(s: String) -> Value {
    RawValue::from_string(s).expect("valid JSON")
}

fn bench_hash_files(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut paths = Vec::new();
    let mut total = 0u64;
    for i in 0..500usize {
        let p = dir.path().join(format!("mod_{i:03}.py"));
        let size = 1024 + (i * 7919) % 7168;
        let body: Vec<u8> = (0..size).map(|j| b"abcdefgh = 1\n"[(i + j) % 13]).collect();
        std::fs::File::create(&p)
            .and_then(|mut f| f.write_all(&body))
            .expect("write bench file");
        total += size as u64;
        paths.push(p.to_str().expect("utf-8 temp path").to_owned());
    }
    let mut g = c.benchmark_group("hash_files");
    g.throughput(Throughput::Bytes(total));
    g.bench_function("500_small_files", |b| {
        b.iter(|| black_box(hash_files(black_box(&paths))).digest)
    });
    g.finish();
}

fn nested_factor() -> Factor {
    let s = |x: &str| Factor::Str(x.to_owned());
    let int = |x: i64| Factor::Int(x.to_string());
    let mut entries = Vec::new();
    for i in 0..64i64 {
        let value = match i % 4 {
            0 => Factor::Bool(i % 8 == 0),
            1 => int(i * 1_000_003),
            2 => Factor::List(vec![
                s("max_autotune"),
                Factor::Float(i as f64 / 3.0),
                Factor::None,
            ]),
            _ => Factor::Dict(vec![
                (s("shape"), Factor::Tuple(vec![int(i), int(4096), int(128)])),
                (s("dtype"), s("torch.bfloat16")),
                (s("strides"), Factor::List((0..8).map(int).collect())),
            ]),
        };
        entries.push((s(&format!("inductor.config.option_{i:02}")), value));
    }
    entries.push((s("torch_version"), s("2.15.0")));
    entries.push((s("source_digest"), Factor::Bytes(vec![0xab; 32])));
    Factor::Dict(entries)
}

fn bench_hash_factors(c: &mut Criterion) {
    let v = nested_factor();
    c.bench_function("hash_factors/nested", |b| b.iter(|| hash_factors(black_box(&v))));
}

fn value_for(k: i64) -> Value {
    raw(format!(r#"{{"artifact":"artifacts/{k:08x}/0123456789abcdef"}}"#))
}

/// A temp folder on tmpfs when there is one: on a disk file system, inode
/// allocation under the create/delete churn of thousands of commits dominates
/// and drifts from run to run.
fn cpu_bench_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().expect("temp dir")
}

fn bench_index_commit(c: &mut Criterion) {
    let mut g = c.benchmark_group("index_commit");
    for &n in &[100i64, 10_000] {
        let dir = cpu_bench_dir();
        let opts = Options {
            fsync: false,
            ..Options::default()
        };
        let mut idx = Index::open(dir.path().join("index"), opts).expect("open index");
        idx.commit(
            (0..n)
                .map(|k| (Key::new(k, k + 1, 0, "inductor"), Some(value_for(k))))
                .collect(),
        )
        .expect("pre-fill");
        idx.compact(None).expect("compact");
        let mut next = 0i64;
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                let k = next % n;
                next += 1;
                idx.insert(Key::new(k, k + 1, 0, "inductor"), value_for(next))
                    .expect("commit");
            })
        });
        assert_eq!(idx.len(), n as usize);
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = bench_hash_files, bench_hash_factors, bench_index_commit
}
criterion_main!(benches);
