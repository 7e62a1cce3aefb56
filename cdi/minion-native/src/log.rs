//! One plain-text line per event on stderr, stamped like cdiflow's Python logs
//! (`%(asctime)s %(name)s %(message)s`), written whole so lines never interleave.

use std::fmt::Arguments;
use std::io::Write;
pub fn info(message: Arguments) {
    line("", message);
}

pub fn warning(message: Arguments) {
    line("warning: ", message);
}

pub fn error(message: Arguments) {
    line("error: ", message);
}

fn line(level: &str, message: Arguments) {
    let text = format!("{} cdi-minion {level}{message}\n", timestamp());
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Local time as Python's logging prints it: "2024-05-01 12:00:00,123".
fn timestamp() -> String {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointers; localtime_r is the thread-safe variant.
    let tm = unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&ts.tv_sec, &mut tm);
        tm
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02},{:03}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        ts.tv_nsec / 1_000_000
    )
}
