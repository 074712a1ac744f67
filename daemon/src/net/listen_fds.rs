//! Listening sockets handed over by a service manager (systemd's socket activation protocol).
//!
//! The manager binds the ports, starts `conchd` with them open as file descriptors 3, 4, …
//! and sets `LISTEN_FDS` (how many), `LISTEN_PID` (the pid they are meant for) and, optionally,
//! `LISTEN_FDNAMES` (their names, separated by `:`). A test harness does the same to start a
//! node on a port it already holds.
//!
//! Which socket is which:
//! - with names, each names its listener: [`CLIENT`] (the client port, `--listen`), [`PEER`]
//!   (the peer port, `--peer-listen`) or [`METRICS`] (`--metrics-listen`); names are
//!   `FileDescriptorName=` in a socket unit;
//! - without names, or when no name is one of those (systemd's default name is the socket
//!   unit's name), by order: the client port, then the peer port, then the metrics port (to
//!   pass the client and metrics ports alone, name them).
//!
//! Invariants:
//! - the sockets are taken only when `LISTEN_PID` is this process (a pid of another process
//!   means the variables leaked from a parent: refused, never guessed);
//! - every descriptor `LISTEN_FDS` announces is used, by exactly one listener, or the start is
//!   refused; nothing else is ever read from fds 3…;
//! - the variables are removed once read, so no process `conchd` starts inherits them;
//! - a listener taken here replaces its `--listen`, `--peer-listen` or `--metrics-listen`
//!   address (a peer socket turns the peer port on): the node listens, and unless
//!   `--advertise`/`--peer-advertise` say otherwise advertises, where the socket is bound.

use std::net::{SocketAddr, TcpListener};

/// The variable naming how many sockets were passed.
pub const LISTEN_FDS: &str = "LISTEN_FDS";
/// The variable naming the process the sockets are meant for.
pub const LISTEN_PID: &str = "LISTEN_PID";
/// The variable naming the sockets, `:`-separated.
pub const LISTEN_FDNAMES: &str = "LISTEN_FDNAMES";
/// The first passed descriptor (`SD_LISTEN_FDS_START`).
pub(crate) const FIRST_FD: i32 = 3;

/// The name of the client listener (`--listen`).
pub(crate) const CLIENT: &str = "client";
/// The name of the peer listener (`--peer-listen`).
pub(crate) const PEER: &str = "peer";
/// The name of the metrics listener (`--metrics-listen`).
pub(crate) const METRICS: &str = "metrics";

/// The listeners a service manager passed; `None` for each one it did not pass.
#[derive(Debug, Default)]
pub struct Inherited {
    pub client: Option<TcpListener>,
    pub peer: Option<TcpListener>,
    pub metrics: Option<TcpListener>,
}

impl Inherited {
    /// True when no socket was passed.
    pub fn is_empty(&self) -> bool {
        self.client.is_none() && self.peer.is_none() && self.metrics.is_none()
    }

    /// The address of `listener`, for the configuration.
    pub fn addr(listener: &Option<TcpListener>) -> Option<SocketAddr> {
        listener.as_ref().and_then(|l| l.local_addr().ok())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListenFdsError {
    #[error("socket activation: {LISTEN_FDS}={0:?} is not a count of descriptors")]
    Count(String),
    #[error(
        "socket activation: {LISTEN_PID}={found:?} is not this process ({ours}); the sockets \
         were passed to another process"
    )]
    Pid { found: String, ours: u32 },
    #[error(
        "socket activation: {LISTEN_FDNAMES} names {names} sockets, but {LISTEN_FDS} passes {fds}"
    )]
    NameCount { names: usize, fds: usize },
    #[error(
        "socket activation: socket name {0:?} is not one of {CLIENT}, {PEER}, {METRICS} \
         (FileDescriptorName= of the socket unit)"
    )]
    UnknownName(String),
    #[error("socket activation: two sockets are named {0:?}")]
    DuplicateName(String),
    #[error(
        "socket activation: {0} sockets passed without names, but there are only 3 listeners \
         ({CLIENT}, {PEER}, {METRICS})"
    )]
    TooMany(usize),
    #[error("socket activation: descriptor {fd} ({name}) is not a listening TCP socket: {error}")]
    NotTcp {
        fd: i32,
        name: String,
        error: String,
    },
}

/// The variables as the service manager set them.
#[derive(Debug, Default, Clone)]
pub struct Vars {
    pub fds: Option<String>,
    pub pid: Option<String>,
    pub names: Option<String>,
}

impl Vars {
    /// Reads the variables and removes them from this process's environment.
    ///
    /// # Safety
    ///
    /// Changes the environment: call it while no other thread runs (first thing in `main`).
    pub unsafe fn take_from_env() -> Vars {
        let read = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
        let vars = Vars {
            fds: read(LISTEN_FDS),
            pid: read(LISTEN_PID),
            names: read(LISTEN_FDNAMES),
        };
        for name in [LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES] {
            // SAFETY: the caller guarantees no other thread reads or writes the environment.
            unsafe { std::env::remove_var(name) };
        }
        vars
    }
}

/// Which listener each passed descriptor is, by position: `roles[i]` is fd `FIRST_FD + i`.
pub fn roles(vars: &Vars, our_pid: u32) -> Result<Vec<&'static str>, ListenFdsError> {
    let Some(fds) = vars.fds.as_deref().map(str::trim) else {
        return Ok(Vec::new());
    };
    let count: usize = fds
        .parse()
        .map_err(|_| ListenFdsError::Count(fds.to_string()))?;
    if count == 0 {
        return Ok(Vec::new());
    }
    let pid = vars.pid.as_deref().unwrap_or("").trim();
    if pid.parse::<u32>().ok() != Some(our_pid) {
        return Err(ListenFdsError::Pid {
            found: pid.to_string(),
            ours: our_pid,
        });
    }
    let names: Vec<&str> = match vars.names.as_deref() {
        Some(names) if !names.is_empty() => names.split(':').collect(),
        _ => Vec::new(),
    };
    if !names.is_empty() && names.len() != count {
        return Err(ListenFdsError::NameCount {
            names: names.len(),
            fds: count,
        });
    }
    let known = |name: &str| [CLIENT, PEER, METRICS].into_iter().find(|k| *k == name);
    let roles: Vec<&'static str> = if names.iter().any(|n| known(n).is_some()) {
        let mut roles = Vec::with_capacity(count);
        for name in &names {
            let role = known(name).ok_or_else(|| ListenFdsError::UnknownName(name.to_string()))?;
            if roles.contains(&role) {
                return Err(ListenFdsError::DuplicateName(role.to_string()));
            }
            roles.push(role);
        }
        roles
    } else {
        let order = [CLIENT, PEER, METRICS];
        if count > order.len() {
            return Err(ListenFdsError::TooMany(count));
        }
        order[..count].to_vec()
    };
    Ok(roles)
}

/// Takes the passed descriptors as listeners, per [`roles`].
///
/// # Safety
///
/// Descriptors `FIRST_FD..FIRST_FD + roles.len()` must be open and owned by nobody else in
/// this process: call it once, before anything in the process could have taken them (the
/// service manager passed them only when `LISTEN_PID` is ours, which [`roles`] checked).
pub unsafe fn take(roles: &[&'static str]) -> Result<Inherited, ListenFdsError> {
    use std::os::fd::FromRawFd;
    let mut inherited = Inherited::default();
    for (i, role) in roles.iter().enumerate() {
        let fd = FIRST_FD + i as i32;
        // SAFETY: the caller guarantees the descriptor is open and ours alone.
        let passed = unsafe { TcpListener::from_raw_fd(fd) };
        let not_tcp = |error: std::io::Error| ListenFdsError::NotTcp {
            fd,
            name: role.to_string(),
            error: error.to_string(),
        };
        passed.local_addr().map_err(not_tcp)?;
        // The manager passes descriptors without close-on-exec; a copy made by `try_clone`
        // has it, so no process this one starts inherits the socket.
        let listener = passed.try_clone().map_err(not_tcp)?;
        drop(passed);
        listener.set_nonblocking(true).map_err(not_tcp)?;
        let slot = match *role {
            CLIENT => &mut inherited.client,
            PEER => &mut inherited.peer,
            _ => &mut inherited.metrics,
        };
        *slot = Some(listener);
    }
    Ok(inherited)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(fds: &str, pid: &str, names: Option<&str>) -> Vars {
        Vars {
            fds: Some(fds.into()),
            pid: Some(pid.into()),
            names: names.map(String::from),
        }
    }

    #[test]
    fn nothing_passed_means_no_sockets() {
        assert_eq!(roles(&Vars::default(), 7), Ok(vec![]));
        assert_eq!(roles(&vars("0", "7", None), 7), Ok(vec![]));
    }

    #[test]
    fn names_say_which_socket_is_which_in_any_order() {
        let v = vars("3", "7", Some("metrics:client:peer"));
        assert_eq!(roles(&v, 7), Ok(vec![METRICS, CLIENT, PEER]));
        let v = vars("2", "7", Some("client:metrics"));
        assert_eq!(roles(&v, 7), Ok(vec![CLIENT, METRICS]));
    }

    #[test]
    fn without_names_the_order_is_client_peer_metrics() {
        assert_eq!(roles(&vars("1", "7", None), 7), Ok(vec![CLIENT]));
        assert_eq!(roles(&vars("2", "7", None), 7), Ok(vec![CLIENT, PEER]));
        assert_eq!(
            roles(&vars("3", "7", None), 7),
            Ok(vec![CLIENT, PEER, METRICS])
        );
        // systemd's default name is the socket unit's: not a listener name, so by order.
        let v = vars("2", "7", Some("conchd.socket:conchd.socket"));
        assert_eq!(roles(&v, 7), Ok(vec![CLIENT, PEER]));
    }

    #[test]
    fn sockets_meant_for_another_process_are_refused() {
        let err = roles(&vars("1", "8", None), 7).unwrap_err();
        assert!(matches!(err, ListenFdsError::Pid { ours: 7, .. }), "{err}");
        let no_pid = Vars {
            fds: Some("1".into()),
            ..Vars::default()
        };
        assert!(matches!(roles(&no_pid, 7), Err(ListenFdsError::Pid { .. })));
    }

    #[test]
    fn counts_and_names_that_do_not_match_are_refused() {
        let cases = [
            (vars("x", "7", None), "not a count"),
            (vars("2", "7", Some("client")), "names 1 sockets"),
            (vars("2", "7", Some("client:nosuch")), "\"nosuch\""),
            (vars("2", "7", Some("client:client")), "two sockets"),
            (vars("4", "7", None), "4 sockets passed without names"),
        ];
        for (v, expected) in cases {
            let err = roles(&v, 7).expect_err(expected).to_string();
            assert!(err.contains(expected), "{v:?}: {err}");
            assert!(err.starts_with("socket activation: "), "{err}");
        }
    }
}
