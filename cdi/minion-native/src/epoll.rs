//! The loop's epoll set: fds watched by a 64-bit token each.

use std::os::fd::RawFd;

use crate::sys;

pub struct Epoll(RawFd);

impl Epoll {
    pub fn new() -> Result<Epoll, String> {
        // SAFETY: a plain system call; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "cannot set up the event loop: {}",
                sys::last_os_error_text()
            ));
        }
        Ok(Epoll(fd))
    }

    pub fn watch(&self, fd: RawFd, token: u64, events: libc::c_int) -> Result<(), String> {
        let mut event = libc::epoll_event {
            events: events as u32,
            u64: token,
        };
        // SAFETY: event is a valid epoll_event; fd is open.
        if unsafe { libc::epoll_ctl(self.0, libc::EPOLL_CTL_ADD, fd, &mut event) } != 0 {
            return Err(format!("epoll_ctl: {}", sys::last_os_error_text()));
        }
        Ok(())
    }

    pub fn unwatch(&self, fd: RawFd) {
        // SAFETY: removing an fd from our epoll set; a null event is allowed since 2.6.9.
        unsafe { libc::epoll_ctl(self.0, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }

    /// Wait for events (`timeout_ms` -1: without a limit); the count, or -1 with errno set.
    pub fn wait(&self, ready: &mut [libc::epoll_event], timeout_ms: libc::c_int) -> libc::c_int {
        // SAFETY: ready is valid for its length.
        unsafe {
            libc::epoll_wait(
                self.0,
                ready.as_mut_ptr(),
                ready.len() as libc::c_int,
                timeout_ms,
            )
        }
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        sys::close(self.0);
    }
}
