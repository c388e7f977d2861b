//! Native core of fxpiece.
//!
//! Pure-Rust modules hold all the logic and are tested with `cargo test`:
//!
//! * [`hash`]: BLAKE3 digests of file sets and JSON-like factor values;
//! * [`index`]: the shared cache index ([`index::format`] its files,
//!   [`index::state`] its merge and stamps);
//! * [`fsutil`]: atomic writes, locks, the hostile-input-safe reader,
//!   quarantine;
//! * [`proc`]: host names, pid liveness, writer identity;
//! * [`sign`]: Ed25519 signatures over domain-separated payload digests;
//! * [`error`]: the one error type.
//!
//! The PyO3 glue (feature `python`, module `py`) only converts values,
//! releases the GIL around hashing and file I/O, and maps [`error::Error`]
//! onto Python exceptions (below: the one place that does).

pub mod error;
pub mod fsutil;
pub mod hash;
pub mod index;
pub mod proc;
pub mod sign;

#[cfg(feature = "python")]
mod py {
    mod convert;
    mod functions;
    mod index;
    mod sign;

    use pyo3::exceptions::{PyTypeError, PyValueError};
    use pyo3::prelude::*;

    use crate::error::Error;

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
                Error::Invalid { .. } => PyValueError::new_err(msg),
                Error::Io { .. } | Error::Refused { .. } => match e.raw_os_error() {
                    Some(errno) => CacheError::new_err((errno, msg, path)),
                    None => CacheError::new_err((msg,)),
                },
                Error::Corrupt { .. } => CorruptIndexError::new_err((libc::EINVAL, msg, path)),
                Error::LockTimeout { .. } => LockTimeoutError::new_err((libc::ETIMEDOUT, msg, path)),
            }
        }
    }

    #[pymodule]
    fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
        functions::register(m)?;
        index::register(m)?;
        sign::register(m)?;
        m.add("FORMAT_VERSION", crate::index::FORMAT_VERSION)?;
        Ok(())
    }
}
