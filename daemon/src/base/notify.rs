//! Service manager notifications (systemd's `sd_notify` protocol, `Type=notify` units).
//!
//! When the manager sets `NOTIFY_SOCKET` (not empty), conchd sends one datagram of `KEY=value` lines to it:
//! `READY=1` once the node has bound its port, opened its data directory and started Raft (it
//! then answers calls; it does not wait for a leader, so a whole cluster started at once by its
//! service managers does not deadlock on a quorum that is still starting), and `STOPPING=1`
//! when it begins to shut down. A path starting with `@` names a socket in the abstract
//! namespace. Without `NOTIFY_SOCKET` nothing is sent. A failed send is logged, never fatal:
//! the manager's own timeout tells the operator.

use std::os::unix::net::UnixDatagram;

/// The variable the service manager sets to its socket's path.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Tells the service manager the node serves.
pub fn ready(status: &str) {
    send(&format!(
        "READY=1\nSTATUS={status}\nMAINPID={}\n",
        std::process::id()
    ));
}

/// Tells the service manager the node is shutting down.
pub fn stopping() {
    send("STOPPING=1\nSTATUS=shutting down\n");
}

fn send(message: &str) {
    let Some(path) = std::env::var_os(NOTIFY_SOCKET).filter(|p| !p.is_empty()) else {
        return;
    };
    if let Err(e) = send_to(&path, message.as_bytes()) {
        tracing::warn!(socket = ?path, error = %e, "could not notify the service manager");
    }
}

fn send_to(path: &std::ffi::OsStr, message: &[u8]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    let sent = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(message, &addr)?
        }
        None => socket.send_to(message, path)?,
    };
    if sent != message.len() {
        return Err(std::io::Error::other("short datagram"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_reaches_a_path_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).expect("bind");
        send_to(path.as_os_str(), b"READY=1\n").expect("send");
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1\n");
    }

    #[test]
    fn a_message_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("conchd-notify-test-{}", std::process::id());
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
        let listener = UnixDatagram::bind_addr(&addr).expect("bind");
        send_to(std::ffi::OsStr::new(&format!("@{name}")), b"STOPPING=1\n").expect("send");
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"STOPPING=1\n");
    }

    #[test]
    fn a_missing_socket_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(send_to(dir.path().join("absent").as_os_str(), b"READY=1\n").is_err());
    }
}
