//! The counts `cdi/client/exports.py` reads in CPython's objects (an mmap's buffer exports, a
//! memoryview's exports, flags and shared buffer), at the offsets it probed: the same reads
//! its `ctypes` path makes, without building a `ctypes` object for each.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// The word at `offset` bytes into `obj`'s struct.
///
/// # Safety
/// `offset` is one `exports.py` probed for this kind of object: inside its struct.
unsafe fn word(address: *const u8, offset: usize) -> isize {
    address.add(offset).cast::<isize>().read_unaligned()
}

/// The word at `offset` into `obj` (`exports.py`'s `_word(id(obj) + offset)`).
#[pyfunction]
pub fn word_at(obj: &Bound<'_, PyAny>, offset: usize) -> isize {
    // SAFETY: the caller passes an offset probed for objects of this type.
    unsafe { word(obj.as_ptr().cast(), offset) }
}

/// `exports.views_in_use` over `handed` (pairs of a view and its base), with the offsets it
/// probed: whether anything but our own views still uses their memory.
#[pyfunction]
pub fn views_in_use(
    handed: &Bound<'_, PyList>,
    exports: usize,
    mbuf: usize,
    registered: usize,
    released: usize,
) -> PyResult<bool> {
    for pair in handed.iter() {
        let pair = pair.downcast::<PyTuple>()?;
        let view = pair.get_item(0)?;
        // SAFETY: offsets probed on memoryviews, and `view` is one (the caller's list holds
        // only the views it sliced); its shared buffer lives as long as it does.
        let in_use = unsafe {
            let address = view.as_ptr().cast::<u8>();
            let ours = if word(address, released) & 1 != 0 {
                1 // the base alone: a released view counts for nothing
            } else if word(address, exports) != 0 {
                return Ok(true);
            } else {
                2
            };
            let shared = word(address, mbuf) as *const u8;
            word(shared, registered) > ours
        };
        if in_use {
            return Ok(true);
        }
    }
    Ok(false)
}
