//! Native core of fxpiece.
//!
//! Pure-Rust modules (`hash`, `index`, `error`) hold all the logic and are
//! tested with `cargo test`; the PyO3 glue below (feature `python`) only
//! converts values, releases the GIL around hashing and file I/O, and maps
//! [`error::Error`] onto Python exceptions.

pub mod error;
pub mod hash;
pub mod index;

#[cfg(feature = "python")]
mod python {
    use std::path::PathBuf;
    use std::sync::Mutex;
    use std::time::Duration;

    use pyo3::exceptions::{PyOSError, PyTypeError, PyUserWarning, PyValueError};
    use pyo3::prelude::*;
    use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
    use serde_json::value::RawValue;

    use crate::error::Error;
    use crate::hash::{self, Factor, FileOutcome};
    use crate::index::{self, Index, Key, Options};

    // The exception classes live in Python (`fxpiece.errors`, one
    // `FxpieceError` base under every one of them); the native code raises
    // those very classes.
    pyo3::import_exception!(fxpiece.errors, CacheError);
    pyo3::import_exception!(fxpiece.errors, CorruptIndexError);
    pyo3::import_exception!(fxpiece.errors, LockTimeoutError);
    pyo3::import_exception!(fxpiece.errors, CacheWarning);

    impl From<Error> for PyErr {
        fn from(e: Error) -> PyErr {
            let msg = e.to_string();
            let path = e.path().map(|p| p.to_string_lossy().into_owned());
            match &e {
                Error::Unsupported { .. } => PyTypeError::new_err(msg),
                Error::Io { .. } => match e.raw_os_error() {
                    Some(errno) => CacheError::new_err((errno, msg, path)),
                    None => CacheError::new_err((msg,)),
                },
                Error::Corrupt { .. } => CorruptIndexError::new_err((libc::EINVAL, msg, path)),
                Error::LockTimeout { .. } => LockTimeoutError::new_err((libc::ETIMEDOUT, msg, path)),
            }
        }
    }

    // ----- hashing ---------------------------------------------------------

    fn fspath(obj: &Bound<'_, PyAny>) -> PyResult<String> {
        let os = obj.py().import("os")?;
        let p = os.call_method1("fspath", (obj,))?;
        p.extract::<String>()
            .map_err(|_| PyTypeError::new_err("paths must be str or os.PathLike[str], not bytes"))
    }

    fn collect_paths(paths: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
        if paths.is_instance_of::<PyString>() {
            return Err(PyTypeError::new_err(
                "hash_files takes a collection of paths, not one str; wrap it in a list",
            ));
        }
        // `str` items (the common case) are taken as they are; only other
        // items go through `os.fspath`, looked up once per call.
        let mut os_fspath: Option<Bound<'_, PyAny>> = None;
        let mut out = Vec::with_capacity(paths.len().unwrap_or(0));
        for item in paths.try_iter()? {
            let item = item?;
            if let Ok(s) = item.cast::<PyString>() {
                out.push(s.to_str()?.to_owned());
                continue;
            }
            let f = match &os_fspath {
                Some(f) => f,
                None => os_fspath.insert(paths.py().import("os")?.getattr("fspath")?),
            };
            out.push(
                f.call1((&item,))?
                    .extract::<String>()
                    .map_err(|_| PyTypeError::new_err("paths must be str or os.PathLike[str], not bytes"))?,
            );
        }
        Ok(out)
    }

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
                FileOutcome::Read { size, digest } => {
                    (f.path.clone(), Some(hash::to_hex(digest)), *size, None)
                }
                FileOutcome::Skipped { reason } => (f.path.clone(), None, 0, Some(reason.clone())),
            })
            .collect();
        Ok((h.hex(), files))
    }

    /// Deepest nesting `hash_factors` accepts: the conversion recurses, so
    /// a deeper (or cyclic) value would overflow the native stack.
    const MAX_FACTOR_DEPTH: usize = 512;
    /// Deepest nesting of a stored index value: reading values back parses
    /// them with serde_json, whose recursion limit is 128.
    const MAX_VALUE_DEPTH: usize = 100;

    fn too_deep(what: &str, limit: usize, at: &str) -> PyErr {
        let chars: Vec<char> = at.chars().collect();
        let shown = if chars.len() > 120 {
            let head: String = chars[..60].iter().collect();
            let tail: String = chars[chars.len() - 40..].iter().collect();
            format!("{head}...{tail}")
        } else {
            at.to_owned()
        };
        PyValueError::new_err(format!(
            "{what}: value nested deeper than {limit} levels (or cyclic) at {shown}"
        ))
    }

    /// Canonical text of an int: decimal when it fits in i64, else `0x`/`-0x`
    /// hex (never subject to `sys.set_int_max_str_digits`). Read from the
    /// integer itself, so an `int` subclass overriding `__str__` cannot alias
    /// two different values.
    fn int_text(obj: &Bound<'_, PyAny>) -> PyResult<String> {
        if let Ok(v) = obj.extract::<i64>() {
            return Ok(v.to_string());
        }
        let int_type = obj.py().get_type::<PyInt>();
        int_type
            .call_method1("__format__", (obj, "#x"))?
            .extract::<String>()
    }

    fn to_factor(obj: &Bound<'_, PyAny>, at: &mut String, depth: usize) -> PyResult<Factor> {
        if obj.is_none() {
            return Ok(Factor::None);
        }
        if let Ok(b) = obj.cast::<PyBool>() {
            return Ok(Factor::Bool(b.is_true()));
        }
        if obj.is_instance_of::<PyInt>() {
            return Ok(Factor::Int(int_text(obj)?));
        }
        if depth >= MAX_FACTOR_DEPTH
            && (obj.is_instance_of::<PyList>()
                || obj.is_instance_of::<PyTuple>()
                || obj.is_instance_of::<PyDict>())
        {
            return Err(too_deep("hash_factors", MAX_FACTOR_DEPTH, at));
        }
        if let Ok(f) = obj.cast::<PyFloat>() {
            return Ok(Factor::Float(f.value()));
        }
        if let Ok(s) = obj.cast::<PyString>() {
            return Ok(Factor::Str(s.to_str()?.to_owned()));
        }
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(Factor::Bytes(b.as_bytes().to_vec()));
        }
        let seq = |items: Vec<Bound<'_, PyAny>>, at: &mut String| -> PyResult<Vec<Factor>> {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let len = at.len();
                at.push_str(&format!("[{i}]"));
                out.push(to_factor(item, at, depth + 1)?);
                at.truncate(len);
            }
            Ok(out)
        };
        if let Ok(l) = obj.cast::<PyList>() {
            return Ok(Factor::List(seq(l.iter().collect(), at)?));
        }
        if let Ok(t) = obj.cast::<PyTuple>() {
            return Ok(Factor::Tuple(seq(t.iter().collect(), at)?));
        }
        if let Ok(d) = obj.cast::<PyDict>() {
            let mut entries = Vec::with_capacity(d.len());
            for (k, v) in d.iter() {
                let len = at.len();
                at.push_str(&format!("[{}]", k.repr()?));
                let kf = to_factor(&k, at, depth + 1)?;
                let vf = to_factor(&v, at, depth + 1)?;
                at.truncate(len);
                entries.push((kf, vf));
            }
            return Ok(Factor::Dict(entries));
        }
        Err(PyTypeError::new_err(format!(
            "hash_factors: unsupported type {} at {at}; use None, bool, int, float, str, bytes, list, tuple or dict (convert it, e.g. str(x))",
            obj.get_type().name()?
        )))
    }

    /// BLAKE3 (hex) of the canonical encoding of a JSON-like value.
    #[pyfunction]
    fn hash_factors(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<String> {
        let mut at = String::from("value");
        let f = to_factor(obj, &mut at, 0)?;
        Ok(py.detach(|| hash::hash_factors(&f)))
    }

    // ----- JSON values ----------------------------------------------------

    fn to_json(obj: &Bound<'_, PyAny>, at: &mut String, depth: usize) -> PyResult<serde_json::Value> {
        use serde_json::Value as J;
        if obj.is_none() {
            return Ok(J::Null);
        }
        if depth >= MAX_VALUE_DEPTH
            && (obj.is_instance_of::<PyList>()
                || obj.is_instance_of::<PyTuple>()
                || obj.is_instance_of::<PyDict>())
        {
            return Err(too_deep("cache index value", MAX_VALUE_DEPTH, at));
        }
        if let Ok(b) = obj.cast::<PyBool>() {
            return Ok(J::Bool(b.is_true()));
        }
        if obj.is_instance_of::<PyInt>() {
            if let Ok(i) = obj.extract::<i64>() {
                return Ok(J::from(i));
            }
            if let Ok(u) = obj.extract::<u64>() {
                return Ok(J::from(u));
            }
            return Err(PyValueError::new_err(format!(
                "cache index values hold 64-bit integers; {at} does not fit; store it as a str"
            )));
        }
        if let Ok(f) = obj.cast::<PyFloat>() {
            return serde_json::Number::from_f64(f.value())
                .map(J::Number)
                .ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "cache index values cannot hold {at} = {}: not finite",
                        f.value()
                    ))
                });
        }
        if let Ok(s) = obj.cast::<PyString>() {
            return Ok(J::String(s.to_str()?.to_owned()));
        }
        let seq = |items: Vec<Bound<'_, PyAny>>, at: &mut String| -> PyResult<serde_json::Value> {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let len = at.len();
                at.push_str(&format!("[{i}]"));
                out.push(to_json(item, at, depth + 1)?);
                at.truncate(len);
            }
            Ok(J::Array(out))
        };
        if let Ok(l) = obj.cast::<PyList>() {
            return seq(l.iter().collect(), at);
        }
        if let Ok(t) = obj.cast::<PyTuple>() {
            return seq(t.iter().collect(), at);
        }
        if let Ok(d) = obj.cast::<PyDict>() {
            let mut m = serde_json::Map::new();
            for (k, v) in d.iter() {
                let Ok(ks) = k.cast::<PyString>() else {
                    return Err(PyTypeError::new_err(format!(
                        "cache index values are JSON: dict keys must be str, got {} at {at}",
                        k.get_type().name()?
                    )));
                };
                let key = ks.to_str()?.to_owned();
                let len = at.len();
                at.push_str(&format!("[{key:?}]"));
                let jv = to_json(&v, at, depth + 1)?;
                at.truncate(len);
                m.insert(key, jv);
            }
            return Ok(J::Object(m));
        }
        Err(PyTypeError::new_err(format!(
            "cache index values are JSON-like; unsupported type {} at {at}",
            obj.get_type().name()?
        )))
    }

    fn from_json<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
        use serde_json::Value as J;
        Ok(match v {
            J::Null => py.None().into_bound(py),
            J::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
            J::Number(n) => {
                if let Some(i) = n.as_i64() {
                    i.into_pyobject(py)?.into_any()
                } else if let Some(u) = n.as_u64() {
                    u.into_pyobject(py)?.into_any()
                } else {
                    n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
                }
            }
            J::String(s) => PyString::new(py, s).into_any(),
            J::Array(items) => {
                let l = PyList::empty(py);
                for it in items {
                    l.append(from_json(py, it)?)?;
                }
                l.into_any()
            }
            J::Object(m) => {
                let d = PyDict::new(py);
                for (k, it) in m {
                    d.set_item(k, from_json(py, it)?)?;
                }
                d.into_any()
            }
        })
    }

    fn raw_to_py<'py>(py: Python<'py>, raw: &str) -> PyResult<Bound<'py, PyAny>> {
        let v: serde_json::Value = serde_json::from_str(raw)
            .map_err(|e| CorruptIndexError::new_err(format!("stored value is not JSON: {e}")))?;
        from_json(py, &v)
    }

    fn py_to_raw(obj: &Bound<'_, PyAny>) -> PyResult<Box<RawValue>> {
        let mut at = String::from("value");
        let v = to_json(obj, &mut at, 0)?;
        let text = serde_json::to_string(&v).map_err(|e| PyValueError::new_err(e.to_string()))?;
        RawValue::from_string(text).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    fn to_key(obj: &Bound<'_, PyAny>) -> PyResult<Key> {
        let bad = || {
            PyTypeError::new_err(format!(
                "cache index keys are (range_start: int, range_end: int, graph_index: int, compiler: str), got {}",
                obj.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        };
        let t = obj.cast::<PyTuple>().map_err(|_| bad())?;
        if t.len() != 4 {
            return Err(bad());
        }
        let int = |i: usize| -> PyResult<i64> {
            let item = t.get_item(i)?;
            if item.is_instance_of::<PyBool>() || !item.is_instance_of::<PyInt>() {
                return Err(bad());
            }
            item.extract::<i64>().map_err(|_| bad())
        };
        let compiler = t
            .get_item(3)?
            .cast::<PyString>()
            .map_err(|_| bad())?
            .to_str()?
            .to_owned();
        Ok(Key::new(int(0)?, int(1)?, int(2)?, compiler))
    }

    fn key_to_py<'py>(py: Python<'py>, k: &Key) -> PyResult<Bound<'py, PyTuple>> {
        (k.start, k.end, k.graph, k.compiler.as_str()).into_pyobject(py)
    }

    // ----- the index ------------------------------------------------------

    /// A cache index folder shared safely by many processes and hosts.
    #[pyclass(module = "fxpiece._native", name = "CacheIndex")]
    struct PyCacheIndex {
        inner: Mutex<Index>,
        path: PathBuf,
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

    fn warn_problems(py: Python<'_>, problems: &[index::Problem]) -> PyResult<()> {
        for p in problems {
            let moved = match &p.moved_to {
                Some(m) => format!("moved aside to {}", m.display()),
                None => "could not be moved aside".to_owned(),
            };
            let msg = format!(
                "fxpiece: cache index file {} is corrupt ({}); {moved}; its entries are treated as missing and will be recompiled",
                p.file.display(),
                p.reason
            );
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
        #[pyo3(signature = (path, *, host=None, use_flock=true, compact_after=64, fsync=true, readonly=false))]
        fn new(
            py: Python<'_>,
            path: &Bound<'_, PyAny>,
            host: Option<String>,
            use_flock: bool,
            compact_after: usize,
            fsync: bool,
            readonly: bool,
        ) -> PyResult<Self> {
            if compact_after < 1 {
                return Err(PyValueError::new_err("compact_after must be >= 1"));
            }
            let path = PathBuf::from(fspath(path)?);
            let mut opts = Options {
                use_flock,
                compact_after,
                fsync,
                readonly,
                ..Options::default()
            };
            if let Some(h) = host {
                opts.host = index::sanitize_host(&h);
            }
            let p2 = path.clone();
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

        /// The index folder.
        #[getter]
        fn path(&self) -> PathBuf {
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
            let wait = match timeout {
                Some(t) if !(t >= 0.0 && t.is_finite()) => {
                    return Err(PyValueError::new_err(
                        "timeout must be a finite number of seconds >= 0",
                    ))
                }
                Some(t) => Some(Duration::from_secs_f64(t)),
                None => None,
            };
            self.with(py, move |i| i.compact(wait))
        }

        fn __repr__(&self) -> String {
            format!(
                "CacheIndex({:?}, entries={})",
                self.path.display().to_string(),
                self.__len__()
            )
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
        let host = index::this_host();
        py.detach(move || index::write_atomic(&dir, &name, &data, &host, fsync))?;
        Ok(())
    }

    #[pymodule]
    fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_function(wrap_pyfunction!(hash_files, m)?)?;
        m.add_function(wrap_pyfunction!(hash_files_report, m)?)?;
        m.add_function(wrap_pyfunction!(hash_factors, m)?)?;
        m.add_function(wrap_pyfunction!(verify_index, m)?)?;
        m.add_function(wrap_pyfunction!(verify_index_file, m)?)?;
        m.add_function(wrap_pyfunction!(write_atomic, m)?)?;
        m.add_class::<PyCacheIndex>()?;
        m.add("FORMAT_VERSION", index::FORMAT_VERSION)?;
        Ok(())
    }
}
