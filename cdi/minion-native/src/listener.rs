//! The minion's listening socket: made so that only whom the configuration names can connect,
//! and accepting connections with their callers' credentials.

use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::log;
use crate::sys;

pub struct Listener {
    pub fd: RawFd,
    path: PathBuf,
    /// An fd kept open to give up when the process runs out of them (see `shed`).
    spare_fd: RawFd,
}

/// An accepted connection: its fd and its peer's pid, uid and gid (SO_PEERCRED).
pub struct Accepted {
    pub fd: RawFd,
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// `.<name>.<pid>.binding` beside `path`.
fn staging_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.binding", std::process::id()))
}

impl Listener {
    /// Create the socket at `path` (replacing a stale one) with `group` and `mode`, and listen.
    /// On error the socket file, if this call created it, is removed again.
    pub fn bind(path: &Path, mode: u32, group: Option<u32>) -> Result<Listener, String> {
        let shown = path.display();
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        let (addr, len) = sys::unix_address(path.as_os_str().as_bytes())
            .ok_or_else(|| format!("socket path {shown} is longer than Unix sockets allow"))?;
        if path.exists() {
            let probe =
                sys::seqpacket_socket().map_err(|e| format!("cannot probe {shown}: {e}"))?;
            // SAFETY: addr/len describe a valid sockaddr_un.
            let answered =
                unsafe { libc::connect(probe, (&addr as *const libc::sockaddr_un).cast(), len) }
                    == 0;
            sys::close(probe);
            if answered {
                return Err(format!("another minion is already listening on {shown}"));
            }
            // A stale socket left by a minion that died.
            std::fs::remove_file(path).map_err(|e| format!("cannot remove {shown}: {e}"))?;
        }
        // Bound and listening under a staging name, then linked into place: the socket's path
        // appears only once a connect to it is accepted (a caller may wait for the file).
        let staging = staging_path(path);
        let (bound_path, (addr, len)) = match sys::unix_address(staging.as_os_str().as_bytes()) {
            Some(staged) => (staging, staged),
            None => (path.to_owned(), (addr, len)), // no room for a longer name: bind the path
        };
        if bound_path != path {
            let _ = std::fs::remove_file(&bound_path); // one left by a start killed right here
        }
        let fd = sys::seqpacket_socket().map_err(|e| format!("cannot listen on {shown}: {e}"))?;
        let mut listener = Listener {
            fd,
            path: bound_path,
            spare_fd: open_spare(),
        };
        // Created 0600 (no moment when anyone else may connect), then given its group and mode.
        // SAFETY: addr/len describe a valid sockaddr_un; fd is our socket; umask is a plain
        // call and the process has one thread.
        let bound = unsafe {
            let umask = libc::umask(0o177);
            let bound = libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len);
            libc::umask(umask);
            bound
        };
        if bound != 0 {
            let err = format!("cannot listen on {shown}: {}", sys::last_os_error_text());
            listener.close_fds();
            return Err(err);
        }
        if let Err(err) = listener.open(mode, group) {
            listener.close();
            return Err(err);
        }
        if listener.path != path {
            // A link, not a rename: a minion that bound `path` meanwhile keeps it (EEXIST).
            let linked = std::fs::hard_link(&listener.path, path);
            let _ = std::fs::remove_file(&listener.path);
            if let Err(e) = linked {
                listener.close_fds();
                return Err(match e.kind() {
                    std::io::ErrorKind::AlreadyExists => {
                        format!("another minion is already listening on {shown}")
                    }
                    _ => format!("cannot listen on {shown}: {e}"),
                });
            }
            listener.path = path.to_owned();
        }
        Ok(listener)
    }

    fn open(&self, mode: u32, group: Option<u32>) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let shown = self.path.display();
        if let Some(group) = group {
            std::os::unix::fs::chown(&self.path, None, Some(group))
                .map_err(|e| format!("cannot give {shown} to group {group}: {e}"))?;
        }
        std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("cannot chmod {shown}: {e}"))?;
        // SAFETY: fd is a bound socket; O_NONBLOCK takes plain flags.
        unsafe {
            if libc::listen(self.fd, 256) != 0 {
                return Err(format!(
                    "cannot listen on {shown}: {}",
                    sys::last_os_error_text()
                ));
            }
            let flags = libc::fcntl(self.fd, libc::F_GETFL);
            libc::fcntl(self.fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        Ok(())
    }

    /// The next waiting connection, non-blocking, with its peer's credentials.
    pub fn accept(&mut self) -> Option<Accepted> {
        // SAFETY: accept4 with null address pointers.
        let fd = unsafe {
            libc::accept4(
                self.fd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            let code = sys::errno();
            if matches!(code, libc::EMFILE | libc::ENFILE) {
                self.shed(code);
            } else if !matches!(code, libc::EAGAIN | libc::EINTR | libc::ECONNABORTED) {
                log::warning(format_args!("accept failed: {}", sys::os_error_text(code)));
            }
            return None;
        }
        let Some((pid, uid, gid)) = sys::peer_credentials(fd) else {
            sys::close(fd);
            return None;
        };
        Some(Accepted { fd, pid, uid, gid })
    }

    /// Out of fds: accept the waiting connection with the spare fd and close it at once, so
    /// the client hears about it and the listener stops reporting readable.
    fn shed(&mut self, code: i32) {
        log::warning(format_args!(
            "refusing a connection: {} (one fd per connection and per segment)",
            sys::os_error_text(code)
        ));
        if self.spare_fd >= 0 {
            sys::close(self.spare_fd);
            // SAFETY: as in accept.
            let fd = unsafe {
                libc::accept4(
                    self.fd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if fd >= 0 {
                sys::close(fd);
            }
            self.spare_fd = open_spare();
        }
    }

    /// Stop listening and remove the socket file.
    pub fn close(self) {
        let _ = std::fs::remove_file(&self.path);
        self.close_fds();
    }

    fn close_fds(self) {
        sys::close(self.fd);
        if self.spare_fd >= 0 {
            sys::close(self.spare_fd);
        }
    }
}

fn open_spare() -> RawFd {
    // SAFETY: a NUL-terminated literal path.
    unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) }
}
