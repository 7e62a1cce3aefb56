//! The command line. `cdiflow cdi minion` (cdi/minion/native.py) resolves the user's config
//! and passes plain values: every size in bytes, the socket mode in octal.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use crate::protocol::Isolation;

pub const USAGE: &str = "usage: cdi-minion --socket PATH --host NAME --memory-limit BYTES \
--max-object BYTES --idle-limit BYTES --isolation cooperative|strict --busy-poll-us N \
--socket-mode OCTAL [--prewarm BYTES:COUNT[,BYTES:COUNT...]] [--events-fd N]";

/// Longest socket path a sockaddr_un holds (with its NUL).
const MAX_SOCKET_PATH: usize = 107;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub socket_path: PathBuf,
    pub host: String,
    pub memory_limit: u64,
    pub max_object: u64,
    pub idle_limit: u64,
    pub isolation: Isolation,
    pub busy_poll_us: u64,
    pub socket_mode: u32,
    /// Object size -> segments to allocate at start, in the order given.
    pub prewarm: Vec<(u64, u64)>,
    pub events_fd: Option<i32>,
}

#[derive(Debug, PartialEq)]
pub enum Command {
    Run(Config),
    Help,
}

const OPTIONS: [&str; 10] = [
    "--socket",
    "--host",
    "--memory-limit",
    "--max-object",
    "--idle-limit",
    "--isolation",
    "--busy-poll-us",
    "--socket-mode",
    "--prewarm",
    "--events-fd",
];

/// Parse the arguments after the program name; the error is one line for stderr.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    let mut values: [Option<OsString>; 10] = Default::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        if text == "-h" || text == "--help" {
            return Ok(Command::Help);
        }
        let (name, inline) = match text.split_once('=') {
            Some((name, _)) if name.starts_with("--") => {
                let value = &arg.as_bytes()[name.len() + 1..];
                (name.to_owned(), Some(OsString::from_vec(value.to_vec())))
            }
            _ => (text.clone(), None),
        };
        let Some(slot) = OPTIONS.iter().position(|o| *o == name) else {
            return Err(if name.starts_with('-') {
                format!("unknown option {name}")
            } else {
                format!("unexpected argument {name:?}")
            });
        };
        let value = match inline.or_else(|| args.next()) {
            Some(value) => value,
            None => return Err(format!("{name} needs a value")),
        };
        if values[slot].replace(value).is_some() {
            return Err(format!("{name} given more than once"));
        }
    }
    let mut value = |option: &str| -> Result<OsString, String> {
        let slot = OPTIONS.iter().position(|o| *o == option).unwrap_or(0);
        values[slot]
            .take()
            .ok_or_else(|| format!("missing {option}"))
    };
    let socket_path = absolute(Path::new(&value("--socket")?))?;
    let host = text(value("--host")?, "--host")?;
    let memory_limit = bytes(&value("--memory-limit")?, "--memory-limit")?;
    let max_object = bytes(&value("--max-object")?, "--max-object")?;
    let idle_limit = bytes(&value("--idle-limit")?, "--idle-limit")?;
    let isolation_text = text(value("--isolation")?, "--isolation")?;
    let isolation = Isolation::parse(&isolation_text).ok_or_else(|| {
        format!("--isolation must be cooperative or strict, not {isolation_text:?}")
    })?;
    let busy_poll_us = bytes(&value("--busy-poll-us")?, "--busy-poll-us")?;
    let socket_mode = mode(&value("--socket-mode")?)?;
    let prewarm = match value("--prewarm") {
        Ok(spec) => prewarm(&text(spec, "--prewarm")?)?,
        Err(_) => Vec::new(),
    };
    let events_fd = match value("--events-fd") {
        Ok(fd) => Some(
            text(fd, "--events-fd")?
                .parse::<i32>()
                .ok()
                .filter(|fd| *fd >= 0)
                .ok_or("--events-fd must be a file descriptor number")?,
        ),
        Err(_) => None,
    };
    if memory_limit == 0 {
        return Err("--memory-limit must be positive".to_owned());
    }
    if max_object == 0 || max_object > memory_limit {
        return Err(format!(
            "--max-object ({max_object}) must be positive and at most --memory-limit \
             ({memory_limit})"
        ));
    }
    Ok(Command::Run(Config {
        socket_path,
        host,
        memory_limit,
        max_object,
        idle_limit,
        isolation,
        busy_poll_us,
        socket_mode,
        prewarm,
        events_fd,
    }))
}

fn text(value: OsString, option: &str) -> Result<String, String> {
    value
        .into_string()
        .map_err(|raw| format!("{option} {raw:?} is not valid UTF-8"))
}

/// A plain non-negative integer (the wrapper resolves units like "10MB" before us).
fn bytes(value: &OsString, option: &str) -> Result<u64, String> {
    let text = value.to_string_lossy();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{option} must be a whole number, not {text:?}"));
    }
    text.parse()
        .map_err(|_| format!("{option} {text} is too large"))
}

fn mode(value: &OsString) -> Result<u32, String> {
    let text = value.to_string_lossy();
    let digits = text.strip_prefix("0o").unwrap_or(&text);
    u32::from_str_radix(digits, 8)
        .ok()
        .filter(|m| *m <= 0o7777 && !digits.is_empty())
        .ok_or_else(|| format!("--socket-mode must be octal permissions like 666, not {text:?}"))
}

/// "BYTES:COUNT[,BYTES:COUNT...]"; a bare BYTES means one segment, empty parts are skipped
/// and a size given twice keeps its first place with the last count (as a Python dict would).
fn prewarm(spec: &str) -> Result<Vec<(u64, u64)>, String> {
    let mut result: Vec<(u64, u64)> = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (size, count) = part.split_once(':').unwrap_or((part, "1"));
        let parse = |t: &str| {
            t.parse::<u64>()
                .ok()
                .filter(|_| t.bytes().all(|b| b.is_ascii_digit()))
        };
        let (Some(size), Some(count)) = (parse(size), parse(count)) else {
            return Err(format!(
                "--prewarm {part:?}: write BYTES:COUNT, e.g. 1000000:4"
            ));
        };
        match result.iter_mut().find(|(s, _)| *s == size) {
            Some(slot) => slot.1 = count,
            None => result.push((size, count)),
        }
    }
    Ok(result)
}

/// The socket path made absolute (lexically, like Python's os.path.abspath), checked to fit.
fn absolute(path: &Path) -> Result<PathBuf, String> {
    if path.as_os_str().is_empty() {
        return Err("--socket must not be empty".to_owned());
    }
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("cannot resolve --socket {}: {e}", path.display()))?
            .join(path)
    };
    let mut clean = PathBuf::from("/");
    for part in joined.components() {
        match part {
            Component::ParentDir => {
                clean.pop();
            }
            Component::Normal(name) => clean.push(name),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    if clean.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(format!(
            "socket path {:?} is longer than Unix sockets allow",
            clean.display().to_string()
        ));
    }
    Ok(clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &str) -> Result<Config, String> {
        match parse(args.split_whitespace().map(OsString::from))? {
            Command::Run(config) => Ok(config),
            Command::Help => Err("help".to_owned()),
        }
    }

    const BASE: &str = "--socket /tmp/m/minion.sock --host h1 --memory-limit 1000000 \
                        --max-object 500000 --idle-limit 250000 --isolation strict \
                        --busy-poll-us 1000 --socket-mode 666";

    #[test]
    fn a_full_command_line() {
        let config = run(&format!(
            "{BASE} --prewarm 4096:2,10000:1,,4096:3 --events-fd 7"
        ))
        .unwrap();
        assert_eq!(config.socket_path, PathBuf::from("/tmp/m/minion.sock"));
        assert_eq!(config.host, "h1");
        assert_eq!(
            (config.memory_limit, config.max_object, config.idle_limit),
            (1_000_000, 500_000, 250_000)
        );
        assert_eq!(config.isolation, Isolation::Strict);
        assert_eq!((config.busy_poll_us, config.socket_mode), (1000, 0o666));
        assert_eq!(config.prewarm, vec![(4096, 3), (10000, 1)]);
        assert_eq!(config.events_fd, Some(7));
        let inline = run(&BASE.replace("--host h1", "--host=h=2")).unwrap();
        assert_eq!(inline.host, "h=2");
        assert_eq!(
            run(&format!("{BASE} --prewarm 8192")).unwrap().prewarm,
            vec![(8192, 1)]
        );
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        let err = |args: &str| run(args).unwrap_err();
        assert_eq!(err("--socket /x"), "missing --host");
        assert_eq!(err(&format!("{BASE} --bogus 1")), "unknown option --bogus");
        assert_eq!(
            err(&format!("{BASE} --events-fd")),
            "--events-fd needs a value"
        );
        assert_eq!(
            err(&format!("{BASE} --host again")),
            "--host given more than once"
        );
        assert!(err(&BASE.replace("1000000", "1MB")).contains("whole number"));
        assert!(err(&BASE.replace("strict", "loose")).contains("cooperative or strict"));
        assert!(err(&BASE.replace("666", "9")).contains("octal"));
        assert!(err(&BASE.replace("500000", "2000000")).contains("at most --memory-limit"));
        assert!(err(&format!("{BASE} --prewarm 10:x")).contains("BYTES:COUNT"));
        assert!(err(&BASE.replace("/tmp/m", &format!("/{}", "d".repeat(120)))).contains("longer"));
        assert_eq!(run(&format!("{BASE} --help")), Err("help".to_owned()));
    }

    #[test]
    fn relative_socket_paths_become_absolute() {
        let config = run(&BASE.replace("/tmp/m/minion.sock", "./a/../m.sock")).unwrap();
        assert_eq!(
            config.socket_path,
            std::env::current_dir().unwrap().join("m.sock")
        );
    }
}
