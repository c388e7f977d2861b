//! Ed25519 signatures ([`crate::sign`]): a frozen `SigningKey` class holding
//! the secret natively, and the verification functions. Payloads are taken
//! through the buffer protocol (bytes, bytearray, memoryview, mmap, ...)
//! without a copy and hashed with the GIL released.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::sign::{self, SecretKey};

/// Runs `f` on the bytes of `payload` (any C-contiguous buffer) with the
/// GIL released. The buffer stays exported (so it cannot be resized or
/// freed) until `f` returns; a caller that mutates a bytearray from
/// another thread meanwhile gets a digest of some mix of its contents,
/// never a crash.
fn with_payload<R: Send>(
    py: Python<'_>,
    payload: &Bound<'_, PyAny>,
    f: impl FnOnce(&[u8]) -> R + Send,
) -> PyResult<R> {
    let buf = PyUntypedBuffer::get(payload)?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(
            "a signed payload must be a contiguous buffer (bytes, bytearray, memoryview)",
        ));
    }
    let len = buf.len_bytes();
    let data: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: the buffer is C-contiguous, `len` bytes long at `buf_ptr`,
        // and stays exported (kept alive, not resizable) while `buf` lives,
        // which outlasts every use of `data` below.
        unsafe { std::slice::from_raw_parts(buf.buf_ptr().cast::<u8>().cast_const(), len) }
    };
    let out = py.detach(|| f(data));
    drop(buf);
    Ok(out)
}

/// An Ed25519 signing key. The secret stays in native memory (zeroed when
/// the key is freed); `seed()` hands it out only to store it.
#[pyclass(frozen, module = "fxpiece._native")]
struct SigningKey(SecretKey);

#[pymethods]
impl SigningKey {
    /// A new key from the operating system's random source.
    #[staticmethod]
    fn generate(py: Python<'_>) -> PyResult<Self> {
        Ok(SigningKey(py.detach(SecretKey::generate)?))
    }

    /// The key with this 32-byte seed (RFC 8032's secret key).
    #[staticmethod]
    fn from_seed(seed: &[u8]) -> PyResult<Self> {
        Ok(SigningKey(SecretKey::from_seed(seed)?))
    }

    /// The 32-byte seed, to write the key to its file.
    fn seed<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.seed())
    }

    /// The 32-byte public key.
    #[getter]
    fn public_key<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.public_key())
    }

    /// The 64-byte signature over `payload` (any buffer) of `kind`.
    fn sign<'py>(
        &self,
        py: Python<'py>,
        kind: &str,
        payload: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        sign::check_kind(kind)?;
        let key = &self.0;
        let sig = with_payload(py, payload, |data| key.sign(kind, data))??;
        Ok(PyBytes::new(py, &sig))
    }

    /// The 64-byte signature over the payload of `kind` whose digest
    /// (`payload_digest`, an artifact's checksum) is `digest` (32 bytes).
    fn sign_digest<'py>(&self, py: Python<'py>, kind: &str, digest: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let key = &self.0;
        let sig = py.detach(|| key.sign_digest(kind, digest))?;
        Ok(PyBytes::new(py, &sig))
    }

    fn __repr__(&self) -> String {
        format!(
            "SigningKey(public_key={})",
            crate::hash::to_hex(&self.0.public_key())
        )
    }
}

/// Whether `signature` (64 bytes) is `public_key`'s signature over
/// `payload` (any buffer) of `kind`. ValueError for a malformed key,
/// signature or kind.
#[pyfunction]
fn verify_signature(
    py: Python<'_>,
    public_key: &[u8],
    kind: &str,
    payload: &Bound<'_, PyAny>,
    signature: &[u8],
) -> PyResult<bool> {
    sign::check_kind(kind)?;
    sign::parse_public_key(public_key)?;
    Ok(with_payload(py, payload, |data| {
        sign::verify(public_key, kind, data, signature)
    })??)
}

/// [`verify_signature`] by the payload's digest (32 bytes).
#[pyfunction]
fn verify_signature_digest(
    py: Python<'_>,
    public_key: &[u8],
    kind: &str,
    digest: &[u8],
    signature: &[u8],
) -> PyResult<bool> {
    Ok(py.detach(|| sign::verify_digest(public_key, kind, digest, signature))?)
}

/// ValueError unless `public_key` is a usable Ed25519 public key (32 bytes,
/// a curve point, not of small order).
#[pyfunction]
fn check_public_key(public_key: &[u8]) -> PyResult<()> {
    sign::parse_public_key(public_key)?;
    Ok(())
}

/// The 32-byte digest a payload is signed by (the raw bytes of its
/// artifact checksum, `hash_factors(payload)`).
#[pyfunction]
fn payload_digest<'py>(py: Python<'py>, payload: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let d = with_payload(py, payload, sign::payload_digest)?;
    Ok(PyBytes::new(py, &d))
}

/// The exact message signed for `kind` and a 32-byte `digest`.
#[pyfunction]
fn signed_message<'py>(py: Python<'py>, kind: &str, digest: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(py, &sign::signed_message(kind, digest)?))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SigningKey>()?;
    m.add_function(wrap_pyfunction!(verify_signature, m)?)?;
    m.add_function(wrap_pyfunction!(verify_signature_digest, m)?)?;
    m.add_function(wrap_pyfunction!(check_public_key, m)?)?;
    m.add_function(wrap_pyfunction!(payload_digest, m)?)?;
    m.add_function(wrap_pyfunction!(signed_message, m)?)?;
    m.add("SIGNATURE_DOMAIN", PyBytes::new(m.py(), sign::DOMAIN))?;
    Ok(())
}
