//! Loopback ports for the nodes a test starts.
//!
//! A port found by binding port 0 comes from the kernel's ephemeral range, the range it also
//! hands to every outgoing connection. Between the moment such a port is released and the
//! moment a node binds it, any connection made on the machine (another test's client, a peer
//! link, a proxy) may take it, and the node fails with "address in use". So these ports come
//! from outside the ephemeral range, where the kernel never hands out a port by itself, and
//! each one is reserved against the other test processes running in parallel by an exclusive
//! lock on a file named after it, held until this process exits. A port is also bound once
//! before it is handed out, so one held by something outside the tests is skipped.

use std::fs::{File, OpenOptions};
use std::net::TcpListener;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Lock files of the ports this process reserved; their locks go with the process.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// Lowest port handed out: below it sit the well-known and registered services.
const LOWEST: u16 = 10_000;

/// A loopback port reserved for this process (see the module documentation).
///
/// Falls back to a port found by binding port 0 when no port outside the ephemeral range can
/// be reserved (a machine whose ephemeral range covers nearly every port).
pub fn free_port() -> u16 {
    free_ports(1)
}

/// The first of `n` consecutive loopback ports, all reserved for this process.
pub fn free_ports(n: u16) -> u16 {
    reserve(n).unwrap_or_else(|| {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .unwrap_or(0)
    })
}

fn reserve(n: u16) -> Option<u16> {
    let pool = pool(ephemeral_range());
    let len = u32::from(pool.end - pool.start).checked_sub(u32::from(n))? + 1;
    let dir = std::env::temp_dir().join("conch-test-ports");
    std::fs::create_dir_all(&dir).ok()?;
    // Processes start at different places so that they rarely meet on the same lock.
    let start = start_offset() % len;
    for step in 0..len {
        let base = pool.start + ((start + step) % len) as u16;
        let mut locks = Vec::new();
        for port in base..base + n {
            match lock(&dir, port) {
                Some(file) if bindable(port) => locks.push(file),
                _ => break,
            }
        }
        if locks.len() == usize::from(n) {
            let mut held = HELD.lock().ok()?;
            held.extend(locks);
            return Some(base);
        }
    }
    None
}

/// Ports outside `ephemeral` that are not well-known: the larger side of it.
fn pool(ephemeral: Range<u16>) -> Range<u16> {
    let below = LOWEST..ephemeral.start.max(LOWEST);
    let above = ephemeral.end.max(LOWEST)..u16::MAX;
    if below.len() >= above.len() {
        below
    } else {
        above
    }
}

/// The kernel's ephemeral range (Linux's default when it cannot be read).
fn ephemeral_range() -> Range<u16> {
    let text =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut bounds = text.split_whitespace().map(str::parse::<u16>);
    match (bounds.next(), bounds.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low <= high => low..high.saturating_add(1),
        _ => 32_768..61_000,
    }
}

fn start_offset() -> u32 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    nanos ^ std::process::id().wrapping_mul(2_654_435_761)
}

/// The port's lock file, locked by this process, or `None` if another process holds it.
fn lock(dir: &std::path::Path, port: u16) -> Option<File> {
    let path: PathBuf = dir.join(port.to_string());
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .ok()?;
    file.try_lock().ok()?;
    Some(file)
}

fn bindable(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_is_the_larger_side_of_the_ephemeral_range() {
        assert_eq!(pool(32_768..61_000), LOWEST..32_768);
        assert_eq!(pool(1_024..50_000), 50_000..u16::MAX);
        assert_eq!(pool(1_024..u16::MAX).len(), 0);
    }

    #[test]
    fn reserved_ports_are_outside_the_ephemeral_range_and_distinct() {
        let ephemeral = ephemeral_range();
        let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
        for port in &ports {
            assert!(!ephemeral.contains(port), "{port} in {ephemeral:?}");
            assert!(*port >= LOWEST, "{port}");
        }
        let mut unique = ports.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
    }

    #[test]
    fn consecutive_ports_are_all_reserved() {
        let base = free_ports(3);
        let dir = std::env::temp_dir().join("conch-test-ports");
        for port in base..base + 3 {
            // This process holds the lock; a second handle of the same file cannot take it.
            let other = OpenOptions::new()
                .write(true)
                .open(dir.join(port.to_string()))
                .expect("the lock file exists");
            assert!(other.try_lock().is_err(), "port {port} is not reserved");
        }
    }
}
