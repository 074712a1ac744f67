//! Listening sockets a test binds itself and hands to the `conchd` it starts, the way a service
//! manager does (socket activation: `LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`, descriptors
//! from 3 on; see conchd's `listen_fds`).
//!
//! A [`Port`] is bound from the moment it is chosen until the node has it: no other test, and
//! no outgoing connection that the kernel gives an ephemeral port, can take it in between. So
//! ports need no reservation scheme and nodes never fail with "address in use".
//!
//! `LISTEN_PID` is only known in the child, after the fork: [`pass`] builds the program's
//! arguments and environment (with room for the pid) before the fork, and the child only moves
//! descriptors, writes its pid's digits and calls `execve`, all async-signal-safe.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use anyhow::Context;

/// A loopback port this test holds: bound and listening, handed to one `conchd` by [`pass`].
#[derive(Debug)]
pub struct Port {
    listener: TcpListener,
    addr: String,
}

impl Port {
    /// A new port on 127.0.0.1, chosen by the kernel.
    pub fn bind() -> anyhow::Result<Port> {
        Port::bind_at("127.0.0.1:0")
    }

    /// `n` new ports.
    pub fn bind_many(n: usize) -> anyhow::Result<Vec<Port>> {
        (0..n).map(|_| Port::bind()).collect()
    }

    /// The port at `addr` again, e.g. for a node restarted at its old address (another process
    /// may have taken it since its last owner closed it; then this fails and says so).
    pub fn bind_at(addr: &str) -> anyhow::Result<Port> {
        let listener = TcpListener::bind(addr).with_context(|| format!("bind {addr}"))?;
        let addr = listener.local_addr().context("local address")?.to_string();
        Ok(Port { listener, addr })
    }

    /// Its address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The listener itself, e.g. for an in-process node.
    pub fn into_listener(self) -> TcpListener {
        self.listener
    }
}

/// A loopback address at which nothing listens and that nothing else can take while the
/// returned socket lives: bound, not listening, so a connection to it is refused.
pub fn closed_port() -> anyhow::Result<(socket_holder::Bound, String)> {
    socket_holder::bound_not_listening()
}

mod socket_holder {
    use anyhow::Context;
    use std::os::fd::{FromRawFd, OwnedFd};

    /// A bound TCP socket that does not listen.
    #[derive(Debug)]
    pub struct Bound(#[allow(dead_code)] OwnedFd);

    pub fn bound_not_listening() -> anyhow::Result<(Bound, String)> {
        // SAFETY: plain socket calls on a descriptor this function owns.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return Err(std::io::Error::last_os_error()).context("socket");
            }
            let owned = OwnedFd::from_raw_fd(fd);
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::bind(fd, (&raw const addr).cast(), len) != 0 {
                return Err(std::io::Error::last_os_error()).context("bind 127.0.0.1:0");
            }
            let mut bound: libc::sockaddr_in = std::mem::zeroed();
            let mut bound_len = len;
            if libc::getsockname(fd, (&raw mut bound).cast(), &mut bound_len) != 0 {
                return Err(std::io::Error::last_os_error()).context("getsockname");
            }
            let port = u16::from_be(bound.sin_port);
            Ok((Bound(owned), format!("127.0.0.1:{port}")))
        }
    }
}

/// Makes `command` start its program with `sockets` as descriptors 3, 4, … and the socket
/// activation variables naming them. Call it last, once the program, arguments and environment
/// are final (it reads them; `env_clear` is not seen). The ports close in this process when
/// `command` is dropped: the child then holds them alone.
pub fn pass(command: &mut Command, sockets: Vec<(&'static str, Port)>) -> anyhow::Result<()> {
    if sockets.is_empty() {
        return Ok(());
    }
    let first = 3;
    let count = sockets.len() as i32;
    let names: Vec<&str> = sockets.iter().map(|(name, _)| *name).collect();
    // Above every target descriptor, so moving one into place never overwrites another.
    let sources = sockets
        .iter()
        .map(|(_, port)| {
            // SAFETY: fcntl on a descriptor this process owns; the copy is owned below.
            let fd = unsafe {
                libc::fcntl(
                    port.listener.as_raw_fd(),
                    libc::F_DUPFD_CLOEXEC,
                    first + count,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error()).context("copy a listening socket");
            }
            // SAFETY: a new descriptor, owned by nothing else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .collect::<anyhow::Result<Vec<OwnedFd>>>()?;
    drop(sockets);

    let cstring = |s: &OsStr| CString::new(s.as_bytes()).context("a NUL byte in an argument");
    let program = cstring(command.get_program())?;
    let mut args = vec![program.clone()];
    for arg in command.get_args() {
        args.push(cstring(arg)?);
    }
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(key, _)| !key.as_bytes().starts_with(b"LISTEN_"))
        .collect();
    for (key, value) in command.get_envs() {
        env.retain(|(k, _)| k != key);
        if let Some(value) = value {
            env.push((key.to_os_string(), value.to_os_string()));
        }
    }
    env.push(("LISTEN_FDS".into(), count.to_string().into()));
    env.push(("LISTEN_FDNAMES".into(), names.join(":").into()));
    let mut envs = env
        .iter()
        .map(|(k, v)| {
            let mut entry = k.as_bytes().to_vec();
            entry.push(b'=');
            entry.extend_from_slice(v.as_bytes());
            CString::new(entry).context("a NUL byte in an environment variable")
        })
        .collect::<anyhow::Result<Vec<CString>>>()?;
    // "LISTEN_PID=" and room for any pid's digits, filled in by the child.
    let pid_prefix = b"LISTEN_PID=".len();
    let mut pid_entry = b"LISTEN_PID=".to_vec();
    pid_entry.resize(pid_prefix + 20, b'0');
    envs.push(CString::new(pid_entry).expect("no NUL byte"));

    let argv = pointers(&args);
    let envp = pointers(&envs);
    let mut exec = Exec {
        sources,
        first,
        pid_entry: envs.last().expect("the pid entry").as_ptr().cast_mut(),
        pid_prefix,
        argv,
        envp,
        _args: args,
        _envs: envs,
    };
    // SAFETY: the closure runs in the child between fork and exec and calls only dup2, getpid
    // and execve, writing into memory allocated before the fork.
    unsafe {
        command.pre_exec(move || exec.run());
    }
    Ok(())
}

/// A NULL-terminated array of pointers to `strings` (which must outlive it).
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// What the child needs to exec with the sockets in place, all allocated before the fork.
struct Exec {
    sources: Vec<OwnedFd>,
    first: i32,
    /// The `LISTEN_PID=` entry, whose digits the child writes.
    pid_entry: *mut libc::c_char,
    pid_prefix: usize,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    // Own the strings the pointers point into (their heap buffers never move).
    _args: Vec<CString>,
    _envs: Vec<CString>,
}

// SAFETY: the pointers point into the strings `Exec` owns; it is used by one thread at a time
// (the child, after the fork) and only read before that.
unsafe impl Send for Exec {}
// SAFETY: as above; `run` takes `&mut self`.
unsafe impl Sync for Exec {}

impl Exec {
    /// In the child: moves the sockets into place, writes `LISTEN_PID` and execs.
    fn run(&mut self) -> io::Result<()> {
        for (i, source) in self.sources.iter().enumerate() {
            // dup2 clears close-on-exec on the copy: the program inherits it.
            // SAFETY: both are descriptor numbers; the target is meant to be replaced.
            if unsafe { libc::dup2(source.as_raw_fd(), self.first + i as i32) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() } as u64;
        let mut digits = 1;
        while pid / 10u64.pow(digits as u32) > 0 {
            digits += 1;
        }
        let mut n = pid;
        for i in (0..digits).rev() {
            // SAFETY: within the entry's 20 digit bytes, allocated before the fork.
            unsafe {
                *self.pid_entry.add(self.pid_prefix + i) = (b'0' + (n % 10) as u8) as libc::c_char
            };
            n /= 10;
        }
        // SAFETY: ends the entry after the digits, inside its buffer.
        unsafe { *self.pid_entry.add(self.pid_prefix + digits) = 0 };
        // SAFETY: NULL-terminated arrays of NUL-terminated strings that outlive the call.
        unsafe { libc::execve(self.argv[0], self.argv.as_ptr(), self.envp.as_ptr()) };
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_port_refuses_connections() {
        let (_held, addr) = closed_port().unwrap();
        let err = std::net::TcpStream::connect(&addr).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{addr}");
    }

    #[test]
    fn the_child_gets_the_sockets_at_3_and_its_own_pid() {
        let ports = Port::bind_many(2).unwrap();
        let addrs: Vec<String> = ports.iter().map(|p| p.addr().to_string()).collect();
        let mut command = Command::new("/bin/sh");
        command.arg("-c").arg(
            "echo \"$LISTEN_PID $$ $LISTEN_FDS $LISTEN_FDNAMES\"; ls -l /proc/$$/fd/3 /proc/$$/fd/4",
        );
        let names = ["client", "peer"];
        pass(&mut command, names.into_iter().zip(ports).collect()).unwrap();
        let output = command.output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let first = stdout.lines().next().unwrap_or_default();
        let fields: Vec<&str> = first.split(' ').collect();
        assert_eq!(
            fields[0], fields[1],
            "LISTEN_PID is the child's pid: {stdout}"
        );
        assert_eq!(&fields[2..], ["2", "client:peer"], "{stdout}");
        assert_eq!(stdout.matches("socket:").count(), 2, "{stdout}");
        // The ports were handed over: once the command is gone (and the child has exited),
        // nothing listens on them.
        drop(command);
        for addr in addrs {
            assert!(std::net::TcpStream::connect(&addr).is_err(), "{addr}");
        }
    }
}
