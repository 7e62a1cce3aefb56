//! The command line, parsed with clap. `cdiflow cdi minion` (cdi/minion/launcher.py) resolves the
//! user's config and passes plain values: every size in bytes, the socket mode in octal.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use crate::protocol::Isolation;

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
    /// Group of the socket file; None: the minion's own.
    pub socket_group: Option<u32>,
    /// Which uid may register which container ids; the first rule that matches decides, an
    /// id no rule matches is the minion's own uid's.
    pub names: Vec<NameRule>,
    /// Object size -> segments to allocate at start, in the order given.
    pub prewarm: Vec<(u64, u64)>,
    pub events_fd: Option<i32>,
    /// How long objects' directory events linger, coalesced (`events.rs`); 0: none.
    pub events_linger_ms: u64,
    /// Where the journal is kept, so that objects outlive the process (`journal.rs`).
    pub state_dir: Option<PathBuf>,
    /// After a restart, how long containers have to come back before the objects of those
    /// that ended go to recovery.
    pub resume_grace_ms: u64,
    /// The same for a container the minion cannot see (another pid namespace): it cannot be
    /// seen to end, and an idle one comes back only at its next request.
    pub resume_grace_unseen_ms: u64,
    /// With its launcher gone (SIGUSR1), how long to serve on waiting for a successor.
    pub successor_wait_ms: u64,
    /// SIGTERM is a stop for a restart (as SIGUSR2), not for good: in a container whose
    /// storage decides how long the objects live (the container runtime sends SIGTERM to
    /// restart it).
    pub term_keeps: bool,
    /// The gateway between hosts (`gateway.rs`): a listening TCP socket, a pipe holding the
    /// cluster's gateway key, and where links that carry channels go.
    pub gateway_fd: Option<i32>,
    pub gateway_key_fd: Option<i32>,
    pub gateway_channels_fd: Option<i32>,
    /// The minion sends to other hosts itself (`sending.rs`), not the gateway beside it.
    pub gateway_sends: bool,
    /// A link that makes no progress for this long mid-handshake or mid-payload is closed.
    pub link_timeout_ms: u64,
}

/// The CDI per-host minion: holds shared-memory objects and enforces single ownership.
#[derive(Parser, Debug)]
#[command(name = "cdi-minion", bin_name = "cdi-minion")]
struct Cli {
    /// Unix socket to listen on (made absolute; at most 107 bytes)
    #[arg(long = "socket", value_name = "PATH", allow_hyphen_values = true,
          value_parser = OsStringValueParser::new().try_map(absolute))]
    socket_path: PathBuf,
    /// Host name this minion serves
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    host: String,
    /// Bytes all objects may take together (positive)
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true, value_parser = whole)]
    memory_limit: u64,
    /// Largest object in bytes (positive, at most --memory-limit)
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true, value_parser = whole)]
    max_object: u64,
    /// Bytes of idle segments kept for reuse
    #[arg(long, value_name = "BYTES", allow_hyphen_values = true, value_parser = whole)]
    idle_limit: u64,
    /// Isolation between clients
    #[arg(long, value_name = "cooperative|strict", allow_hyphen_values = true,
          value_parser = isolation)]
    isolation: Isolation,
    /// Microseconds to busy-poll before sleeping
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = whole)]
    busy_poll_us: u64,
    /// Socket permissions in octal, e.g. 666
    #[arg(long, value_name = "OCTAL", allow_hyphen_values = true, value_parser = mode)]
    socket_mode: u32,
    /// Group (gid) of the socket file
    #[arg(long, value_name = "GID", allow_hyphen_values = true, value_parser = whole_u32)]
    socket_group: Option<u32>,
    /// Which uid may register which container ids: PATTERN=UID[,PATTERN=UID...], a pattern
    /// being an id or a prefix ending in *
    #[arg(long, value_name = "PATTERN=UID[,...]", allow_hyphen_values = true, value_parser = names)]
    names: Option<Names>,
    /// Segments to allocate at start
    #[arg(long, value_name = "BYTES:COUNT[,BYTES:COUNT...]", allow_hyphen_values = true,
          value_parser = prewarm)]
    prewarm: Option<Prewarm>,
    /// File descriptor to write directory events to
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = events_fd)]
    events_fd: Option<i32>,
    /// Milliseconds an object's directory events wait, the latest replacing the ones before
    /// (an object created and destroyed within it is never reported); 0: each at once
    #[arg(long, value_name = "MS", allow_hyphen_values = true, value_parser = whole,
          default_value = "200")]
    events_linger_ms: u64,
    /// Folder for the journal: objects then outlive the process (in /dev/shm, not a reboot)
    #[arg(long, value_name = "PATH", allow_hyphen_values = true,
          value_parser = OsStringValueParser::new().try_map(absolute_dir))]
    state_dir: Option<PathBuf>,
    /// After a restart: milliseconds containers have to come back before the objects of
    /// those that ended go to recovery
    #[arg(long, value_name = "MS", allow_hyphen_values = true, value_parser = whole,
          default_value = "2000")]
    resume_grace_ms: u64,
    /// After a restart: milliseconds a container in another pid namespace (whose end cannot be
    /// seen) has to come back before it counts as ended
    #[arg(long, value_name = "MS", allow_hyphen_values = true, value_parser = whole,
          default_value = "30000")]
    resume_grace_unseen_ms: u64,
    /// With a state folder, after SIGUSR1 (the launcher died): milliseconds to serve on until
    /// a successor takes the folder over
    #[arg(long, value_name = "MS", allow_hyphen_values = true, value_parser = whole,
          default_value = "5000")]
    successor_wait_ms: u64,
    /// With a state folder: SIGTERM stops for a restart (keeping the objects, as SIGUSR2), not
    /// for good; SIGINT still stops for good
    #[arg(long, requires = "state_dir")]
    term_keeps: bool,
    /// A listening TCP socket (inherited) on which other hosts' gateways offer objects
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = events_fd,
          requires = "gateway_key_fd")]
    gateway_fd: Option<i32>,
    /// A pipe (inherited) holding the cluster's gateway key, read to its end at start
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = events_fd,
          requires = "gateway_fd")]
    gateway_key_fd: Option<i32>,
    /// A Unix socket (inherited) to which links that carry a channel are handed, with their
    /// request
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = events_fd,
          requires = "gateway_fd")]
    gateway_channels_fd: Option<i32>,
    /// Send transfers to other hosts' gateways from this process (`transfer … via` to a
    /// container not here), asking the gateway beside it for routes over
    /// --gateway-channels-fd
    #[arg(long, requires = "gateway_channels_fd")]
    gateway_sends: bool,
    /// Milliseconds a gateway link may make no progress mid-handshake or mid-payload
    #[arg(long, value_name = "MS", allow_hyphen_values = true, value_parser = whole,
          default_value = "10000")]
    link_timeout_ms: u64,
}

/// Wrapped so that clap takes the whole list as one value instead of one per item.
#[derive(Clone, Debug)]
struct Prewarm(Vec<(u64, u64)>);

#[derive(Clone, Debug)]
struct Names(Vec<NameRule>);

/// A container id, or a prefix ending in `*`, and the one uid that may register it.
#[derive(Clone, Debug, PartialEq)]
pub struct NameRule {
    pattern: String,
    pub uid: u32,
}

impl NameRule {
    pub fn matches(&self, name: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == self.pattern,
        }
    }
}

/// The uid that may register `name`: the first matching rule's, else `default` (the minion's).
pub fn uid_for(rules: &[NameRule], name: &str, default: u32) -> u32 {
    rules
        .iter()
        .find(|rule| rule.matches(name))
        .map_or(default, |rule| rule.uid)
}

/// "PATTERN=UID[,PATTERN=UID...]" (the wrapper resolves user names to uids before us).
fn names(spec: &str) -> Result<Names, String> {
    let mut rules = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let parsed = part
            .split_once('=')
            .filter(|(pattern, _)| !pattern.is_empty())
            .and_then(|(pattern, uid)| Some((pattern, whole_u32(uid).ok()?)));
        let Some((pattern, uid)) = parsed else {
            return Err(format!("{part:?}: write PATTERN=UID, e.g. worker-*=10004"));
        };
        rules.push(NameRule {
            pattern: pattern.to_owned(),
            uid,
        });
    }
    Ok(Names(rules))
}

fn whole_u32(text: &str) -> Result<u32, String> {
    u32::try_from(whole(text)?).map_err(|_| "too large".to_owned())
}

/// Parse a whole command line (program name first); `--help` comes back as an error of kind
/// `DisplayHelp`, whose `exit()` prints it and exits 0 (every other error: stderr, status 2).
pub fn parse<I, T>(args: I) -> Result<Config, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(args)?;
    let invalid = |message: String| Cli::command().error(ErrorKind::ValueValidation, message);
    if cli.memory_limit == 0 {
        return Err(invalid("--memory-limit must be positive".to_owned()));
    }
    if cli.max_object == 0 || cli.max_object > cli.memory_limit {
        return Err(invalid(format!(
            "--max-object ({}) must be positive and at most --memory-limit ({})",
            cli.max_object, cli.memory_limit
        )));
    }
    Ok(Config {
        socket_path: cli.socket_path,
        host: cli.host,
        memory_limit: cli.memory_limit,
        max_object: cli.max_object,
        idle_limit: cli.idle_limit,
        isolation: cli.isolation,
        busy_poll_us: cli.busy_poll_us,
        socket_mode: cli.socket_mode,
        socket_group: cli.socket_group,
        names: cli.names.map_or_else(Vec::new, |n| n.0),
        prewarm: cli.prewarm.map_or_else(Vec::new, |p| p.0),
        events_fd: cli.events_fd,
        events_linger_ms: cli.events_linger_ms,
        state_dir: cli.state_dir,
        resume_grace_ms: cli.resume_grace_ms,
        resume_grace_unseen_ms: cli.resume_grace_unseen_ms,
        successor_wait_ms: cli.successor_wait_ms,
        term_keeps: cli.term_keeps,
        gateway_fd: cli.gateway_fd,
        gateway_key_fd: cli.gateway_key_fd,
        gateway_channels_fd: cli.gateway_channels_fd,
        gateway_sends: cli.gateway_sends,
        link_timeout_ms: cli.link_timeout_ms,
    })
}

/// The process's own command line; on a bad one (or `--help`) clap reports and exits.
pub fn parse_or_exit() -> Config {
    parse(std::env::args_os()).unwrap_or_else(|error| error.exit())
}

/// A plain non-negative integer (the wrapper resolves units like "10MB" before us).
fn whole(text: &str) -> Result<u64, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("must be a whole number".to_owned());
    }
    text.parse().map_err(|_| "too large".to_owned())
}

fn isolation(text: &str) -> Result<Isolation, String> {
    Isolation::parse(text).ok_or_else(|| "must be cooperative or strict".to_owned())
}

fn mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    u32::from_str_radix(digits, 8)
        .ok()
        .filter(|m| *m <= 0o7777 && !digits.is_empty())
        .ok_or_else(|| "must be octal permissions like 666".to_owned())
}

fn events_fd(text: &str) -> Result<i32, String> {
    text.parse::<i32>()
        .ok()
        .filter(|fd| *fd >= 0)
        .ok_or_else(|| "must be a file descriptor number".to_owned())
}

/// "BYTES:COUNT[,BYTES:COUNT...]"; a bare BYTES means one segment, empty parts are skipped
/// and a size given twice keeps its first place with the last count (as a Python dict would).
fn prewarm(spec: &str) -> Result<Prewarm, String> {
    let mut result: Vec<(u64, u64)> = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (size, count) = part.split_once(':').unwrap_or((part, "1"));
        let parse = |t: &str| {
            t.parse::<u64>()
                .ok()
                .filter(|_| t.bytes().all(|b| b.is_ascii_digit()))
        };
        let (Some(size), Some(count)) = (parse(size), parse(count)) else {
            return Err(format!("{part:?}: write BYTES:COUNT, e.g. 1000000:4"));
        };
        match result.iter_mut().find(|(s, _)| *s == size) {
            Some(slot) => slot.1 = count,
            None => result.push((size, count)),
        }
    }
    Ok(Prewarm(result))
}

/// A folder path made absolute (no length limit).
fn absolute_dir(raw: OsString) -> Result<PathBuf, String> {
    let path = Path::new(&raw);
    if path.as_os_str().is_empty() {
        return Err("must not be empty".to_owned());
    }
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    std::env::current_dir()
        .map(|cwd| cwd.join(path))
        .map_err(|e| format!("cannot resolve it: {e}"))
}

/// The socket path made absolute (lexically, like Python's os.path.abspath), checked to fit.
fn absolute(raw: OsString) -> Result<PathBuf, String> {
    let path = Path::new(&raw);
    if path.as_os_str().is_empty() {
        return Err("must not be empty".to_owned());
    }
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("cannot resolve it: {e}"))?
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

    fn run(args: &str) -> Result<Config, clap::Error> {
        parse(std::iter::once("cdi-minion").chain(args.split_whitespace()))
    }

    const BASE: &str = "--socket /tmp/m/minion.sock --host h1 --memory-limit 1000000 \
                        --max-object 500000 --idle-limit 250000 --isolation strict \
                        --busy-poll-us 1000 --socket-mode 666";

    #[test]
    fn the_command_is_well_formed() {
        Cli::command().debug_assert();
    }

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
        assert_eq!((config.socket_group, config.names.len()), (None, 0));
        let named = run(&format!(
            "{BASE} --socket-group 1100 --names worker-*=1001,sched=1002"
        ))
        .unwrap();
        assert_eq!(named.socket_group, Some(1100));
        assert!(named.names[0].matches("worker-7") && !named.names[0].matches("sched"));
        assert!(named.names[1].matches("sched") && !named.names[1].matches("sched-2"));
        assert_eq!((named.names[0].uid, named.names[1].uid), (1001, 1002));
        let inline = run(&BASE.replace("--host h1", "--host=h=2")).unwrap();
        assert_eq!(inline.host, "h=2");
        assert_eq!(
            run(&format!("{BASE} --prewarm 8192")).unwrap().prewarm,
            vec![(8192, 1)]
        );
        assert_eq!(run(BASE).unwrap().prewarm, vec![]);
        assert_eq!(run(BASE).unwrap().events_fd, None);
        assert_eq!(
            (
                run(BASE).unwrap().state_dir,
                run(BASE).unwrap().resume_grace_ms
            ),
            (None, 2000)
        );
        assert_eq!(run(BASE).unwrap().resume_grace_unseen_ms, 30000);
        let kept = run(&format!("{BASE} --state-dir /var/x --resume-grace-ms 50")).unwrap();
        assert_eq!(
            (kept.state_dir, kept.resume_grace_ms),
            (Some(PathBuf::from("/var/x")), 50)
        );
        assert!(!kept.term_keeps);
        assert!(
            run(&format!("{BASE} --state-dir /var/x --term-keeps"))
                .unwrap()
                .term_keeps
        );
        assert!(run(&format!("{BASE} --term-keeps")).is_err()); // nothing to keep without one
        assert_eq!(
            run(&BASE.replace("666", "0o600")).unwrap().socket_mode,
            0o600
        );
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        let err = |args: &str| run(args).unwrap_err();
        let says = |args: &str, kind: ErrorKind, text: &str| {
            let error = err(args);
            let message = error.to_string();
            assert_eq!(error.kind(), kind, "{args}: {message}");
            assert!(message.contains(text), "{args}: {message}");
            assert_eq!(error.exit_code(), 2);
        };
        says("--socket /x", ErrorKind::MissingRequiredArgument, "--host");
        says(
            &format!("{BASE} --bogus 1"),
            ErrorKind::UnknownArgument,
            "--bogus",
        );
        says(
            &format!("{BASE} extra"),
            ErrorKind::UnknownArgument,
            "extra",
        );
        says(
            &format!("{BASE} --events-fd"),
            ErrorKind::InvalidValue,
            "--events-fd",
        );
        says(
            &format!("{BASE} --host again"),
            ErrorKind::ArgumentConflict,
            "--host",
        );
        let invalid = |args: &str, text: &str| says(args, ErrorKind::ValueValidation, text);
        invalid(&BASE.replace("1000000", "1MB"), "whole number");
        invalid(
            &BASE.replace("1000000", "99999999999999999999"),
            "too large",
        );
        invalid(&BASE.replace("strict", "loose"), "cooperative or strict");
        invalid(&BASE.replace("666", "9"), "octal");
        invalid(&BASE.replace("666", "17777"), "octal");
        invalid(&BASE.replace("500000", "2000000"), "at most --memory-limit");
        invalid(&BASE.replace("500000", "0"), "at most --memory-limit");
        invalid(
            &BASE.replace("--memory-limit 1000000", "--memory-limit 0"),
            "must be positive",
        );
        invalid(&format!("{BASE} --prewarm 10:x"), "BYTES:COUNT");
        invalid(&format!("{BASE} --names worker"), "PATTERN=UID");
        invalid(&format!("{BASE} --names =5"), "PATTERN=UID");
        invalid(&format!("{BASE} --names w=alice"), "PATTERN=UID");
        invalid(&format!("{BASE} --events-fd -1"), "file descriptor");
        invalid(
            &BASE.replace("/tmp/m", &format!("/{}", "d".repeat(120))),
            "longer",
        );
        let help = err(&format!("{BASE} --help"));
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        assert_eq!(help.exit_code(), 0);
        assert_eq!(err("-h").kind(), ErrorKind::DisplayHelp);
    }

    #[test]
    fn the_first_matching_rule_decides_and_the_rest_is_the_minions() {
        let rules = run(&format!(
            "{BASE} --names worker-*=1001,worker-admin=0,sched=7"
        ))
        .unwrap()
        .names;
        assert_eq!(uid_for(&rules, "worker-7", 42), 1001);
        assert_eq!(uid_for(&rules, "worker-admin", 42), 1001); // the prefix rule came first
        assert_eq!(uid_for(&rules, "sched", 42), 7);
        assert_eq!(uid_for(&rules, "sched-2", 42), 42); // an exact name is not a prefix
        assert_eq!(uid_for(&[], "anything", 42), 42);
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
