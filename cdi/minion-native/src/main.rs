//! `cdi-minion`: the CDI per-host minion. It serves `cdi/PROTOCOL.md`; `cdiflow cdi minion`
//! (`cdi/minion/`, Python) checks its configuration and runs it. It is Rust because the minion
//! sits on every hand-off, where an interpreter spends most of a hand-off's microseconds.

mod args;
mod compact;
mod compact_layout;
mod epoll;
mod events;
mod gateway;
mod journal;
mod listener;
mod log;
mod msgpack;
mod objects;
mod ops;
mod protocol;
mod recovery;
mod registry;
mod replies;
mod resume;
mod segments;
mod sending;
mod server;
mod sharing;
mod sys;
mod token;

use std::sync::atomic::{AtomicBool, Ordering};

use events::EventSink;
use server::{Minion, KEEP, ORPHANED, STOP, WAKE_FD};

/// `--term-keeps`: SIGTERM acts as SIGUSR2.
static TERM_KEEPS: AtomicBool = AtomicBool::new(false);

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    // On a bad command line clap prints the error and exits 2; on --help, the help and 0.
    let config = args::parse_or_exit();
    let term_keeps = config.term_keeps;
    let linger_ms = config.events_linger_ms;
    let events = match config.events_fd.map(|fd| EventSink::open(fd, linger_ms)) {
        None => None,
        Some(Ok(sink)) => Some(sink),
        Some(Err(message)) => {
            eprintln!("cdi-minion: error: {message}");
            return 2;
        }
    };
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let place = info
            .location()
            .map(|l| format!(" at {l}"))
            .unwrap_or_default();
        log::error(format_args!("panic{place}: {message}"));
    }));
    raise_fd_limit();
    let mut minion = match Minion::new(config, events) {
        Ok(minion) => minion,
        Err(message) => {
            log::error(format_args!("{message}"));
            return 1;
        }
    };
    TERM_KEEPS.store(term_keeps, Ordering::SeqCst);
    install_signal_handlers();
    if let Err(message) = minion.bind() {
        log::error(format_args!("{message}"));
        return 1;
    }
    if minion.serve_forever() {
        // Nothing is torn down: the segment files and the journal stay for the next minion.
        std::process::exit(0);
    }
    0
}

extern "C" fn on_signal(signal: libc::c_int) {
    if signal == libc::SIGUSR1 {
        ORPHANED.store(true, Ordering::SeqCst); // the loop decides, once woken
    } else {
        if signal == libc::SIGUSR2 || (signal == libc::SIGTERM && TERM_KEEPS.load(Ordering::SeqCst))
        {
            KEEP.store(true, Ordering::SeqCst);
        }
        STOP.store(true, Ordering::SeqCst);
    }
    let fd = WAKE_FD.load(Ordering::SeqCst);
    // SAFETY: only async-signal-safe calls (write) and errno is restored for the code we
    // interrupted.
    unsafe {
        let saved = *libc::__errno_location();
        if fd >= 0 {
            libc::write(fd, b"x".as_ptr().cast(), 1);
        }
        *libc::__errno_location() = saved;
    }
}

/// SIGTERM and SIGINT stop the loop cleanly: the socket is removed, the segments freed.
/// SIGUSR2 stops it for a restart: with a state folder, the objects stay for the next minion;
/// so does SIGTERM with `--term-keeps`.
/// SIGUSR1 (its launcher died) lets it serve on until a successor asks for the state folder.
fn install_signal_handlers() {
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGUSR2, libc::SIGUSR1] {
        // SAFETY: a zeroed sigaction with a handler and an empty mask is valid.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// Every segment holds an fd in the minion, so the usual soft limit of 1024 would cap a host
/// at ~1000 objects; take what the hard limit allows.
fn raise_fd_limit() {
    // SAFETY: valid out/in pointers to an rlimit.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}
