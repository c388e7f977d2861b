//! The `CacheIndex` class and the index verification functions.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::convert::{fspath, key_to_py, py_to_raw, raw_to_py, to_key};
use super::CacheWarning;
use crate::error::Error;
use crate::fsutil::DEFAULT_MAX_FILE_BYTES;
use crate::index::{self, Index, Key, Options, Problem, ProblemKind};
use crate::proc;

// The literal default of `max_file_bytes` below (a literal, so Python's
// `inspect.signature` shows it) is the core's.
const _: () = assert!(DEFAULT_MAX_FILE_BYTES == 268_435_456);

/// A finite, non-negative number of seconds.
fn seconds(what: &str, t: f64) -> PyResult<Duration> {
    if !(t >= 0.0 && t.is_finite()) {
        return Err(PyValueError::new_err(format!(
            "{what} must be a finite number of seconds >= 0"
        )));
    }
    Ok(Duration::from_secs_f64(t))
}

/// A cache index folder shared safely by many processes and hosts.
#[pyclass(module = "fxpiece._native", name = "CacheIndex")]
pub(super) struct PyCacheIndex {
    inner: Mutex<Index>,
    /// The folder as given (after `os.fspath`).
    path: String,
}

impl PyCacheIndex {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Index) -> Result<T, Error> + Send,
    ) -> PyResult<T> {
        let (out, problems) = py.detach(|| {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let out = f(&mut g);
            (out, g.take_problems())
        });
        warn_problems(py, &problems)?;
        Ok(out?)
    }
}

fn warn_problems(py: Python<'_>, problems: &[Problem]) -> PyResult<()> {
    for p in problems {
        let moved = match &p.moved_to {
            Some(m) => format!("moved aside to {}", m.display()),
            None => "could not be moved aside".to_owned(),
        };
        let msg = match p.kind {
            ProblemKind::Corrupt => format!(
                "fxpiece: cache index file {} is corrupt ({}); {moved}; its entries are treated as missing and will be recompiled",
                p.file.display(),
                p.reason
            ),
            ProblemKind::Refused => format!(
                "fxpiece: cache index file {} was refused unread ({}); {moved}; its entries, if any, are treated as missing and will be recompiled",
                p.file.display(),
                p.reason
            ),
            ProblemKind::FutureStamp => format!(
                "fxpiece: cache index file {} is stamped in the future ({})",
                p.file.display(),
                p.reason
            ),
        };
        PyErr::warn(
            py,
            &py.get_type::<CacheWarning>(),
            &std::ffi::CString::new(msg)?,
            2,
        )?;
    }
    Ok(())
}

#[pymethods]
impl PyCacheIndex {
    #[new]
    #[pyo3(signature = (
        path,
        *,
        host=None,
        use_flock=true,
        compact_after=64,
        fsync=true,
        readonly=false,
        max_file_bytes=268_435_456,
        max_clock_skew=3600.0,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        host: Option<String>,
        use_flock: bool,
        compact_after: usize,
        fsync: bool,
        readonly: bool,
        max_file_bytes: u64,
        max_clock_skew: f64,
    ) -> PyResult<Self> {
        if compact_after < 1 {
            return Err(PyValueError::new_err("compact_after must be >= 1"));
        }
        let max_clock_skew = seconds("max_clock_skew", max_clock_skew)?;
        let path = fspath(path)?;
        let mut opts = Options {
            use_flock,
            compact_after,
            fsync,
            readonly,
            max_file_bytes,
            max_clock_skew,
            ..Options::default()
        };
        if let Some(h) = host {
            opts.host = proc::sanitize_host(&h);
        }
        let p2 = PathBuf::from(&path);
        let (idx, problems) = py.detach(move || {
            Index::open(p2, opts).map(|mut i| {
                let pr = i.take_problems();
                (i, pr)
            })
        })?;
        warn_problems(py, &problems)?;
        Ok(PyCacheIndex {
            inner: Mutex::new(idx),
            path,
        })
    }

    /// The index folder, as given (a str).
    #[getter]
    fn path(&self) -> String {
        self.path.clone()
    }

    /// The host name this handle writes into stamps and file names.
    #[getter]
    fn host(&self) -> String {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .options()
            .host
            .clone()
    }

    #[pyo3(signature = (key, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let k = to_key(key)?;
        let raw: Option<String> = {
            let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.get(&k).map(|r| r.get().to_owned())
        };
        match raw {
            Some(r) => raw_to_py(py, &r),
            None => Ok(default.unwrap_or_else(|| py.None().into_bound(py))),
        }
    }

    fn __contains__(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = to_key(key)?;
        Ok(self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&k)
            .is_some())
    }

    fn __len__(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Commit one entry (durable when this returns).
    fn insert(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let op = (to_key(key)?, Some(py_to_raw(value)?));
        self.with(py, move |i| i.commit(vec![op]))
    }

    /// Commit many entries at once: a mapping or an iterable of (key, value) pairs.
    fn update(&self, py: Python<'_>, mapping: &Bound<'_, PyAny>) -> PyResult<()> {
        let items = if let Ok(d) = mapping.cast::<PyDict>() {
            d.items().into_any()
        } else if mapping.hasattr("items")? {
            mapping.call_method0("items")?
        } else {
            mapping.clone()
        };
        let mut ops = Vec::new();
        for pair in items.try_iter()? {
            let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair?.extract()?;
            ops.push((to_key(&k)?, Some(py_to_raw(&v)?)));
        }
        self.with(py, move |i| i.commit(ops))
    }

    /// Remove an entry; returns whether it was present in this view.
    fn remove(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = to_key(key)?;
        self.with(py, move |i| i.remove(k))
    }

    /// Live entries as (key, value) pairs sorted by key.
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Vec<(Bound<'py, PyTuple>, Bound<'py, PyAny>)>> {
        let items: Vec<(Key, String)> = {
            let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.entries()
                .into_iter()
                .map(|(k, v)| (k.clone(), v.get().to_owned()))
                .collect()
        };
        items
            .iter()
            .map(|(k, v)| Ok((key_to_py(py, k)?, raw_to_py(py, v)?)))
            .collect()
    }

    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let keys: Vec<Key> = {
            let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.entries().into_iter().map(|(k, _)| k.clone()).collect()
        };
        keys.iter().map(|k| key_to_py(py, k)).collect()
    }

    /// Merge what other processes committed since the last refresh.
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |i| i.refresh())
    }

    /// Merge all files into one snapshot. `timeout=None` skips (returns
    /// False) if another process on this host is compacting; a number
    /// waits that many seconds, then raises LockTimeoutError.
    #[pyo3(signature = (timeout=None))]
    fn compact(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let wait = timeout.map(|t| seconds("timeout", t)).transpose()?;
        self.with(py, move |i| i.compact(wait))
    }

    fn __repr__(&self) -> String {
        format!("CacheIndex({:?}, entries={})", self.path, self.__len__())
    }
}

/// Check every file of the index folder at `path`. Returns
/// `(good_files, problems)` with problems `(file, reason, moved_to or None)`;
/// with `repair=True` bad files are moved aside to `*.corrupt-<time>`.
#[pyfunction]
#[pyo3(signature = (path, *, repair=false))]
#[allow(clippy::type_complexity)]
fn verify_index(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    repair: bool,
) -> PyResult<(usize, Vec<(String, String, Option<String>)>)> {
    let p = PathBuf::from(fspath(path)?);
    let (ok, problems) = py.detach(move || Index::verify(&p, repair))?;
    Ok((
        ok,
        problems
            .into_iter()
            .map(|p| {
                (
                    p.file.to_string_lossy().into_owned(),
                    p.reason,
                    p.moved_to.map(|m| m.to_string_lossy().into_owned()),
                )
            })
            .collect(),
    ))
}

/// Verify one index file; raises CorruptIndexError naming what is wrong.
/// Returns the number of records in it.
#[pyfunction]
fn verify_index_file(py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<usize> {
    let p = PathBuf::from(fspath(path)?);
    Ok(py.detach(move || index::verify_file(&p))?)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCacheIndex>()?;
    m.add_function(wrap_pyfunction!(verify_index, m)?)?;
    m.add_function(wrap_pyfunction!(verify_index_file, m)?)?;
    Ok(())
}
