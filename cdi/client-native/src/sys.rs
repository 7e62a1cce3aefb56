//! The socket calls of a hot operation: one send, then the reply awaited as the Python client
//! awaits it (polled for a while without sleeping, then asleep in the kernel until a deadline).
//! Each runs without the GIL; none touches a Python object.

use std::io;
use std::mem;
use std::os::fd::RawFd;

/// What a receive brought: the message's length in the buffer and the fd it carried.
pub struct Received {
    pub len: usize,
    pub fd: Option<RawFd>,
    /// The message, or its fds, did not fit (`MSG_TRUNC`, `MSG_CTRUNC`).
    pub truncated: bool,
}

pub enum Waited {
    Message(Received),
    TimedOut,
    /// A signal came: the caller runs Python's handlers, then waits again.
    Interrupted,
    Failed(io::Error),
}

fn interrupted(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::EINTR)
}

/// CLOCK_MONOTONIC in seconds: the clock of Python's `time.monotonic()`.
pub fn monotonic() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

/// Send one message without blocking; `Ok(false)` when the socket's buffer is full.
pub fn send(fd: RawFd, data: &[u8]) -> io::Result<bool> {
    loop {
        let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
        // SAFETY: `data` is valid for its length.
        let sent = unsafe { libc::send(fd, data.as_ptr().cast(), data.len(), flags) };
        if sent >= 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EAGAIN) => return Ok(false),
            Some(libc::EINTR) => continue, // not sent: nothing to run Python for yet
            _ => return Err(err),
        }
    }
}

/// One message and at most one fd (any other is closed); `Ok(None)` when `dontwait` and none
/// is there.
fn receive(fd: RawFd, buf: &mut [u8], dontwait: bool) -> io::Result<Option<Received>> {
    // Room for one fd, aligned as a cmsghdr must be.
    let mut control = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(mem::size_of::<RawFd>() as u32) } as usize;
    let flags = libc::MSG_CMSG_CLOEXEC | if dontwait { libc::MSG_DONTWAIT } else { 0 };
    // SAFETY: `msg` describes buffers we own.
    let len = unsafe { libc::recvmsg(fd, &mut msg, flags) };
    if len < 0 {
        let err = io::Error::last_os_error();
        if dontwait && err.raw_os_error() == Some(libc::EAGAIN) {
            return Ok(None);
        }
        return Err(err);
    }
    let mut kept = None;
    // SAFETY: walking the control buffer the kernel filled, by the kernel's own macros.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / mem::size_of::<RawFd>() {
                    let fd = data.add(i).read_unaligned();
                    if kept.is_none() {
                        kept = Some(fd);
                    } else {
                        libc::close(fd);
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(Some(Received {
        len: len as usize,
        fd: kept,
        truncated: msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
    }))
}

/// Wait for one message: polled without sleeping until `spin_until` (monotonic seconds; 0, not
/// at all), yielding the core between polls, then asleep until `deadline` (or for good).
pub fn wait(fd: RawFd, buf: &mut [u8], spin_until: f64, deadline: Option<f64>) -> Waited {
    let outcome = (|| {
        if spin_until > 0.0 {
            loop {
                if let Some(message) = receive(fd, buf, true)? {
                    return Ok(Waited::Message(message));
                }
                if monotonic() >= spin_until {
                    break;
                }
                // SAFETY: no arguments.
                unsafe { libc::sched_yield() }; // let a runnable peer on this core go first
            }
        }
        let Some(deadline) = deadline else {
            loop {
                if let Some(message) = receive(fd, buf, false)? {
                    return Ok(Waited::Message(message));
                }
            }
        };
        loop {
            let remaining = deadline - monotonic();
            if remaining <= 0.0 || !poll_in(fd, (remaining * 1000.0).ceil().max(1.0) as i32)? {
                return Ok(Waited::TimedOut);
            }
            if let Some(message) = receive(fd, buf, true)? {
                return Ok(Waited::Message(message));
            }
        }
    })();
    match outcome {
        Ok(waited) => waited,
        Err(err) if interrupted(&err) => Waited::Interrupted,
        Err(err) => Waited::Failed(err),
    }
}

fn poll_in(fd: RawFd, timeout_ms: i32) -> io::Result<bool> {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut pollfd, 1, timeout_ms) };
    if ready < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ready > 0)
}

pub fn close(fd: RawFd) {
    // SAFETY: an fd the kernel gave us and nobody else holds.
    unsafe { libc::close(fd) };
}
