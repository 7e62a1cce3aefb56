//! `cdi._hotpath`: the CDI client's two hot operations, `transfer` and `access`, each one call
//! from Python that builds the compact request, sends it, awaits the reply into a reused
//! buffer and reads it, with the GIL released around the socket calls
//! (`cdi.client.connection` uses it when it is present and the minion takes the compact form).
//!
//! It reads only what it alone expects: a compact success reply to the request it sent. Any
//! other message (an error map, a reply to another request) goes back to Python as bytes and
//! is read there, so the client's rules and errors stay in one place.

mod peek;
mod sys;
mod wire;

use std::os::fd::RawFd;

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use pyo3::{intern, IntoPyObjectExt};

use sys::Waited;
use wire::Reply;

/// The largest message either side sends (`cdi.protocol.MAX_MESSAGE`).
const MAX_MESSAGE: usize = 1 << 20;

/// What a hot operation returns: the reply (a dict for a compact success of this request,
/// bytes for any other message, `None` when the minion hung up) and the fd it carried.
type Exchanged = (PyObject, Option<RawFd>);

/// One connection's hot path: its socket (owned by the Python connection) and its buffers.
#[pyclass(module = "cdi._hotpath")]
struct Wire {
    fd: RawFd,
    request: Vec<u8>,
    /// Zeroed pages the kernel maps on first touch: only those replies reach stay resident.
    reply: Vec<u8>,
}

#[pymethods]
impl Wire {
    #[new]
    fn new(fd: RawFd) -> Self {
        Wire {
            fd,
            request: Vec::with_capacity(256),
            reply: vec![0; MAX_MESSAGE],
        }
    }

    /// Send `transfer` and wait for its reply; `None` when nothing was sent (a string too long
    /// for the compact form, or the socket's buffer full): the caller sends it its own way.
    fn transfer(
        &mut self,
        py: Python<'_>,
        request_id: i64,
        key: &str,
        to: &str,
        via: &str,
    ) -> PyResult<Option<Exchanged>> {
        if !wire::transfer(&mut self.request, request_id, key, to, via) {
            return Ok(None);
        }
        self.exchange(py, request_id, 0.0, None)
    }

    /// Send `access` and wait for its grant: polled for `spin_s` seconds first, then asleep
    /// until `deadline` (`time.monotonic()`'s clock; `None`, for good). `AccessTimeout` when
    /// nothing came by then; `None` when nothing was sent, as for `transfer`.
    #[allow(clippy::too_many_arguments)] // the request's fields and how to wait for its reply
    #[pyo3(signature = (request_id, key, wait, have, spin_s, deadline))]
    fn access(
        &mut self,
        py: Python<'_>,
        request_id: i64,
        key: &str,
        wait: bool,
        have: Option<i64>,
        spin_s: f64,
        deadline: Option<f64>,
    ) -> PyResult<Option<Exchanged>> {
        if !wire::access(&mut self.request, request_id, key, wait, have) {
            return Ok(None);
        }
        self.exchange(py, request_id, spin_s, deadline)
    }
}

impl Wire {
    fn exchange(
        &mut self,
        py: Python<'_>,
        request_id: i64,
        spin_s: f64,
        deadline: Option<f64>,
    ) -> PyResult<Option<Exchanged>> {
        let (fd, request, reply) = (self.fd, &self.request, &mut self.reply);
        let first = py.allow_threads(|| -> std::io::Result<Option<(Waited, f64)>> {
            if !sys::send(fd, request)? {
                return Ok(None);
            }
            let mut spin_until = 0.0;
            if spin_s > 0.0 {
                spin_until = sys::monotonic() + spin_s;
                if let Some(deadline) = deadline {
                    spin_until = spin_until.min(deadline);
                }
            }
            Ok(Some((
                sys::wait(fd, reply, spin_until, deadline),
                spin_until,
            )))
        });
        let (mut waited, spin_until) = match first {
            Ok(Some(sent)) => sent,
            Ok(None) => return Ok(None),
            Err(err) => return Err(os_error(py, err)),
        };
        while let Waited::Interrupted = waited {
            py.check_signals()?; // a handler that raises ends the wait, as in Python
            waited = py.allow_threads(|| sys::wait(fd, reply, spin_until, deadline));
        }
        match waited {
            Waited::Message(message) => self.read(py, request_id, message).map(Some),
            Waited::TimedOut => Err(cdi_error(
                py,
                "AccessTimeout",
                "ownership did not arrive before the timeout".to_owned(),
            )),
            Waited::Failed(err) => Err(os_error(py, err)),
            Waited::Interrupted => unreachable!("waited again above"),
        }
    }

    fn read(&self, py: Python<'_>, request_id: i64, message: sys::Received) -> PyResult<Exchanged> {
        if message.len == 0 || message.truncated {
            if let Some(fd) = message.fd {
                sys::close(fd);
            }
            if message.len == 0 {
                return Ok((py.None(), None)); // the minion hung up
            }
            let why = format!("message larger than {MAX_MESSAGE} bytes");
            return Err(cdi_error(py, "ProtocolError", why));
        }
        let data = &self.reply[..message.len];
        let body = match wire::decode(data) {
            Some(reply) if reply.id() == request_id => as_dict(py, reply)?,
            _ => PyBytes::new(py, data).into_any().unbind(),
        };
        Ok((body, message.fd))
    }
}

/// The map a compact reply stands for (`cdi.compact.decode_reply`'s).
fn as_dict(py: Python<'_>, reply: Reply<'_>) -> PyResult<PyObject> {
    let dict = PyDict::new(py);
    dict.set_item(intern!(py, "id"), reply.id())?;
    dict.set_item(intern!(py, "ok"), true)?;
    match reply {
        Reply::Grant(grant) => {
            dict.set_item(intern!(py, "size"), grant.size)?;
            dict.set_item(intern!(py, "capacity"), grant.capacity)?;
            dict.set_item(intern!(py, "generation"), grant.generation)?;
            let isolation = if grant.strict {
                intern!(py, "strict")
            } else {
                intern!(py, "cooperative")
            };
            dict.set_item(intern!(py, "isolation"), isolation)?;
            dict.set_item(intern!(py, "segment"), grant.segment)?;
        }
        Reply::Moved(moved) => {
            dict.set_item(intern!(py, "generation"), moved.generation)?;
            dict.set_item(intern!(py, "keep_mapping"), moved.keep_mapping)?;
            dict.set_item(intern!(py, "to"), moved.to)?;
        }
    }
    dict.into_py_any(py)
}

/// `OSError(errno, os.strerror(errno))`, as Python's socket calls raise it (a subclass by
/// errno: `BrokenPipeError`, `ConnectionResetError`, …).
fn os_error(py: Python<'_>, err: std::io::Error) -> PyErr {
    let Some(errno) = err.raw_os_error() else {
        return PyOSError::new_err(err.to_string());
    };
    let text = py
        .import("os")
        .and_then(|os| os.getattr("strerror")?.call1((errno,))?.extract::<String>())
        .unwrap_or_else(|_| err.to_string());
    PyOSError::new_err((errno, text))
}

/// An exception of `cdi.errors`, by class name.
fn cdi_error(py: Python<'_>, class: &str, message: String) -> PyErr {
    match py
        .import("cdi.errors")
        .and_then(|errors| errors.getattr(class)?.call1((message,)))
    {
        Ok(exception) => PyErr::from_value(exception),
        Err(err) => err,
    }
}

#[pymodule]
fn _hotpath(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Wire>()?;
    module.add_function(wrap_pyfunction!(peek::views_in_use, module)?)?;
    module.add_function(wrap_pyfunction!(peek::word_at, module)?)?;
    module.add("MAX_MESSAGE", MAX_MESSAGE)?;
    Ok(())
}
