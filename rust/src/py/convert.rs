//! Conversions between Python values and the core's: paths, factor values,
//! JSON index values and keys.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::value::RawValue;

use super::CorruptIndexError;
use crate::hash::Factor;
use crate::index::Key;

pub(crate) fn fspath(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let os = obj.py().import("os")?;
    let p = os.call_method1("fspath", (obj,))?;
    p.extract::<String>()
        .map_err(|_| PyTypeError::new_err("paths must be str or os.PathLike[str], not bytes"))
}

pub(crate) fn collect_paths(paths: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
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

/// Deepest nesting `hash_factors` accepts: the conversion recurses, so
/// a deeper (or cyclic) value would overflow the native stack.
const MAX_FACTOR_DEPTH: usize = 512;
/// Deepest nesting of a stored index value (the index refuses files
/// holding deeper ones, so what is stored can be read back).
const MAX_VALUE_DEPTH: usize = crate::index::MAX_VALUE_DEPTH;

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

pub(crate) fn to_factor(obj: &Bound<'_, PyAny>, at: &mut String, depth: usize) -> PyResult<Factor> {
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

pub(crate) fn raw_to_py<'py>(py: Python<'py>, raw: &str) -> PyResult<Bound<'py, PyAny>> {
    let v: serde_json::Value = serde_json::from_str(raw)
        .map_err(|e| CorruptIndexError::new_err(format!("stored value is not JSON: {e}")))?;
    from_json(py, &v)
}

pub(crate) fn py_to_raw(obj: &Bound<'_, PyAny>) -> PyResult<Box<RawValue>> {
    let mut at = String::from("value");
    let v = to_json(obj, &mut at, 0)?;
    let text = serde_json::to_string(&v).map_err(|e| PyValueError::new_err(e.to_string()))?;
    RawValue::from_string(text).map_err(|e| PyValueError::new_err(e.to_string()))
}

pub(crate) fn to_key(obj: &Bound<'_, PyAny>) -> PyResult<Key> {
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

pub(crate) fn key_to_py<'py>(py: Python<'py>, k: &Key) -> PyResult<Bound<'py, PyTuple>> {
    (k.start, k.end, k.graph, k.compiler.as_str()).into_pyobject(py)
}
