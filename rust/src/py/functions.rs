//! Module-level functions: hashing, atomic writes, and the file-system and
//! process helpers the Python side shares with the index (one
//! implementation of quarantine naming, pid liveness, host names and safe
//! reading).

use std::path::PathBuf;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt};

use super::convert::{collect_paths, fspath, to_factor};
use crate::fsutil;
use crate::hash::{self, FileOutcome};
use crate::proc;

/// BLAKE3 (hex) over the set of files; unreadable files are skipped.
#[pyfunction]
fn hash_files(py: Python<'_>, paths: &Bound<'_, PyAny>) -> PyResult<String> {
    let paths = collect_paths(paths)?;
    Ok(py.detach(|| hash::hash_files(&paths).hex()))
}

/// `(digest, files)` where files are `(path, digest or None, size, skipped reason or None)`.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn hash_files_report(
    py: Python<'_>,
    paths: &Bound<'_, PyAny>,
) -> PyResult<(String, Vec<(String, Option<String>, u64, Option<String>)>)> {
    let paths = collect_paths(paths)?;
    let h = py.detach(|| hash::hash_files(&paths));
    let files = h
        .files
        .iter()
        .map(|f| match &f.outcome {
            FileOutcome::Read { size, digest } => (f.path.clone(), Some(hash::to_hex(digest)), *size, None),
            FileOutcome::Skipped { reason } => (f.path.clone(), None, 0, Some(reason.clone())),
        })
        .collect();
    Ok((h.hex(), files))
}

/// BLAKE3 (hex) of the canonical encoding of a JSON-like value.
#[pyfunction]
fn hash_factors(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut at = String::from("value");
    let f = to_factor(obj, &mut at, 0)?;
    Ok(py.detach(|| hash::hash_factors(&f)))
}

/// BLAKE3 (hex) of a bytes-like payload, equal to `hash_factors(bytes(data))`
/// but over the caller's buffer (bytes, bytearray, memoryview, mmap): no
/// copy, GIL released while hashing.
#[pyfunction]
fn checksum(py: Python<'_>, data: PyBuffer<u8>) -> PyResult<String> {
    let Some(ptr) = data.as_slice_ptr() else {
        return Err(PyValueError::new_err("checksum needs a C-contiguous buffer"));
    };
    let (addr, len) = (ptr.as_ptr() as *const u8 as usize, ptr.len());
    // SAFETY: `data` holds the buffer export for this whole call, so the
    // memory stays valid; u8 has no invalid values. A concurrent writer can
    // only change the bytes hashed (the caller's buffer is its own), never
    // make this read out of bounds.
    Ok(py.detach(move || {
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        hash::checksum_bytes(bytes)
    }))
}

/// Write bytes to a file atomically (temp in the same folder, fsync,
/// rename, folder fsync).
#[pyfunction]
#[pyo3(signature = (path, data, *, fsync=true))]
fn write_atomic(py: Python<'_>, path: &Bound<'_, PyAny>, data: Vec<u8>, fsync: bool) -> PyResult<()> {
    let p = PathBuf::from(fspath(path)?);
    let dir = p
        .parent()
        .map(|d| d.to_path_buf())
        .unwrap_or_else(|| PathBuf::from("."));
    let dir = if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    };
    let name = p
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| PyValueError::new_err(format!("{} has no file name", p.display())))?
        .to_owned();
    let host = proc::this_host();
    py.detach(move || fsutil::write_atomic(&dir, &name, &data, &host, fsync))?;
    Ok(())
}

/// fsync each regular file of `paths`, then their folders, with the GIL
/// released once for the whole batch (no symlink followed, no FIFO
/// opened; a file gone is skipped). Returns `"<path>: <reason>"` for each
/// entry that could not be made durable.
#[pyfunction]
fn sync_files(py: Python<'_>, paths: Vec<Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let files = paths
        .iter()
        .map(|p| fspath(p).map(PathBuf::from))
        .collect::<PyResult<Vec<_>>>()?;
    let failed = py.detach(move || fsutil::sync_files(&files));
    Ok(failed
        .into_iter()
        .map(|(p, why)| format!("{}: {why}", p.display()))
        .collect())
}

/// Move a bad file (or folder, FIFO, symlink: the entry itself) aside to
/// `<path>.corrupt-<unix seconds>` (`.corrupt-<secs>.<n>` if taken), never
/// overwriting an earlier quarantined copy. Returns the new path, or None if
/// it could not be moved (missing, permissions, read-only folder).
#[pyfunction]
fn quarantine(py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let p = PathBuf::from(fspath(path)?);
    Ok(py
        .detach(move || fsutil::quarantine(&p))
        .ok()
        .map(|a| a.to_string_lossy().into_owned()))
}

/// Whether a process with this pid exists in this PID namespace. Never
/// raises for an int: zero, negative and out-of-range pids are not alive.
#[pyfunction]
fn pid_alive(pid: &Bound<'_, PyInt>) -> bool {
    pid.extract::<i64>().is_ok_and(proc::pid_alive)
}

/// This process's PID namespace on this boot (12 hex digits), as the
/// index's temp-file names and the compile leases record it; `None` when it
/// cannot be read (no `/proc`): then no pid can be judged dead, only age.
#[pyfunction]
fn namespace_id() -> Option<&'static str> {
    proc::namespace_id()
}

/// This host's name as the cache writes it into file names.
#[pyfunction]
fn this_host() -> String {
    proc::this_host()
}

/// Read a whole regular file of at most `max_bytes` bytes without following
/// symlinks or opening FIFOs, sockets, devices or folders (all refused with
/// CacheError: errno ELOOP, ENXIO or EISDIR; EFBIG when over the cap;
/// `filename` set).
#[pyfunction]
fn read_regular_file<'py>(
    py: Python<'py>,
    path: &Bound<'py, PyAny>,
    max_bytes: i64,
) -> PyResult<Bound<'py, PyBytes>> {
    let max = u64::try_from(max_bytes).map_err(|_| PyValueError::new_err("max_bytes must be >= 0"))?;
    let p = PathBuf::from(fspath(path)?);
    let data = py.detach(move || fsutil::read_regular_file(&p, max))?;
    Ok(PyBytes::new(py, &data))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(hash_files, m)?)?;
    m.add_function(wrap_pyfunction!(hash_files_report, m)?)?;
    m.add_function(wrap_pyfunction!(hash_factors, m)?)?;
    m.add_function(wrap_pyfunction!(checksum, m)?)?;
    m.add_function(wrap_pyfunction!(write_atomic, m)?)?;
    m.add_function(wrap_pyfunction!(quarantine, m)?)?;
    m.add_function(wrap_pyfunction!(sync_files, m)?)?;
    m.add_function(wrap_pyfunction!(pid_alive, m)?)?;
    m.add_function(wrap_pyfunction!(this_host, m)?)?;
    m.add_function(wrap_pyfunction!(namespace_id, m)?)?;
    m.add_function(wrap_pyfunction!(read_regular_file, m)?)?;
    Ok(())
}
