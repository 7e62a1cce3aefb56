//! Thin wrappers over the few system calls the minion makes, and Python-style OSError text.

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;

pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `str(OSError(n))` in Python: "[Errno 28] No space left on device".
pub fn os_error_text(code: i32) -> String {
    // SAFETY: strerror returns a pointer to a NUL-terminated static or thread-local string;
    // the minion is single-threaded and copies it at once.
    let text = unsafe { CStr::from_ptr(libc::strerror(code)) };
    format!("[Errno {code}] {}", text.to_string_lossy())
}

pub fn last_os_error_text() -> String {
    os_error_text(errno())
}

pub fn close(fd: RawFd) {
    // SAFETY: closing an fd this process owns; errors (EINTR, EIO) leave nothing to retry.
    unsafe {
        libc::close(fd);
    }
}

/// Nanoseconds on CLOCK_MONOTONIC (Python's `perf_counter_ns`).
pub fn monotonic_ns() -> u64 {
    clock(libc::CLOCK_MONOTONIC)
}

/// Seconds since the epoch as a float (Python's `time.time()`).
pub fn unix_time() -> f64 {
    clock(libc::CLOCK_REALTIME) as f64 / 1e9
}

fn clock(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; both clocks always exist on Linux.
    unsafe {
        libc::clock_gettime(id, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn sched_yield() {
    // SAFETY: no arguments, cannot fail on Linux.
    unsafe {
        libc::sched_yield();
    }
}

pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        page as u64
    } else {
        4096
    }
}

/// Send one message without blocking or raising SIGPIPE, with at most one fd (SCM_RIGHTS).
/// Returns the errno on failure.
pub fn send_message(sock: RawFd, data: &[u8], fd: Option<RawFd>) -> Result<(), i32> {
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
    let sent = match fd {
        // SAFETY: data is a valid buffer for its length.
        None => unsafe { libc::send(sock, data.as_ptr().cast(), data.len(), flags) },
        Some(fd) => {
            let mut iov = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            // Room for one cmsghdr with one int, aligned as the kernel wants.
            let mut control = [0u64; 4];
            // SAFETY: CMSG_SPACE is a pure computation.
            let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
            // SAFETY: msghdr is plain data; zeroed is a valid empty header.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points at `control`, which is larger than `space`, so the
            // first header and its data lie inside it.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
                libc::sendmsg(sock, &msg, flags)
            }
        }
    };
    if sent < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// (pid, uid, gid) of a Unix socket's peer, from the kernel (SO_PEERCRED).
pub fn peer_credentials(sock: RawFd) -> Option<(i32, u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid out-pointers of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some((cred.pid, cred.uid, cred.gid))
}

/// A pidfd (close-on-exec) of a Unix socket's peer: SO_PEERPIDFD (Linux 6.5), else
/// pidfd_open of its pid; `None` if neither works (the peer is gone, or has pid 0: in another
/// pid namespace).
pub fn peer_pidfd(sock: RawFd, pid: i32) -> Option<RawFd> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: pidfd and len are valid out-pointers of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut pidfd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 && pidfd >= 0 {
        return Some(pidfd);
    }
    if pid <= 0 {
        return None;
    }
    // SAFETY: a plain system call; PIDFD_NONBLOCK is not needed, the loop only polls it.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    (fd >= 0).then_some(fd as RawFd)
}

pub fn unix_address(path: &[u8]) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.len() >= addr.sun_path.len() {
        return None;
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(path) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + path.len() + 1;
    Some((addr, len as libc::socklen_t))
}

pub fn seqpacket_socket() -> io::Result<RawFd> {
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(fd)
    }
}

/// A path as a NUL-terminated C string.
pub fn c_path(path: &std::path::Path) -> Result<std::ffi::CString, crate::protocol::Failure> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        crate::protocol::Failure::Internal(format!("{} holds a NUL byte", path.display()))
    })
}

/// When process `pid` started (clock ticks after boot, /proc/<pid>/stat's 22nd field): with
/// the pid, it names one process for the life of the host. `None` if it is not running.
pub fn process_start(pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (2nd field) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This boot of the host (/proc/sys/kernel/random/boot_id): /dev/shm does not outlive it.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_owned())
        .unwrap_or_default()
}

/// A pidfd (close-on-exec) of process `pid`, if it runs.
pub fn pidfd_open(pid: i32) -> Option<RawFd> {
    if pid <= 0 {
        return None;
    }
    // SAFETY: a plain system call.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    (fd >= 0).then_some(fd as RawFd)
}

/// 16 random hex digits (getrandom; the clock and pid if it fails).
pub fn random_id() -> String {
    let mut bytes = [0u8; 8];
    // SAFETY: bytes is valid for its length.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    let value = if got == bytes.len() as isize {
        u64::from_le_bytes(bytes)
    } else {
        monotonic_ns() ^ (u64::from(std::process::id()) << 40)
    };
    format!("{value:016x}")
}
