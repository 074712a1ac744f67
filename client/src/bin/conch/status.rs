//! The wait you can see: while `conch sema`, `conch elect` or `conch lock` queues, one status
//! line on stderr says where it stands (position in the queue, what blocks a lock, who holds
//! and for how long, how long it has waited), redrawn in place and cleared when the wait ends.
//!
//! Only when stderr is a terminal; with `-v` (terminal or not) it prints plain lines instead,
//! at most one every [`PLAIN_EVERY`]; otherwise nothing, so scripts see what they always saw.
//!
//! The line is drawn with two ANSI sequences (carriage return, erase line) and cut to the
//! terminal's width, so it never wraps and erasing it leaves nothing behind: no terminal
//! library is needed for one line.

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conch_client::{Client, format_duration};

/// How the wait is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Off,
    /// One line on a terminal, redrawn in place.
    Line,
    /// Plain lines (`-v`).
    Plain,
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// Decides the mode once, from `-v` and whether stderr is a terminal.
pub(crate) fn init(verbose: u8) {
    let mode = if verbose > 0 {
        Mode::Plain
    } else if std::io::stderr().is_terminal() {
        Mode::Line
    } else {
        Mode::Off
    };
    let _ = MODE.set(mode);
}

fn mode() -> Mode {
    MODE.get().copied().unwrap_or(Mode::Off)
}

/// Nothing is shown for a wait shorter than this.
const FIRST_AFTER: Duration = Duration::from_millis(300);
/// How often the line is redrawn (the waited time moves).
const REDRAW_EVERY: Duration = Duration::from_secs(1);
/// How often the queue and the holders are read again.
const FETCH_EVERY: Duration = Duration::from_secs(2);
/// The least time between two plain lines.
pub(crate) const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// The longest a read for the line may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the wait stands.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Standing {
    /// 0 = next; `None`: not (yet) in this semaphore's queue.
    pub position: Option<u64>,
    pub queued: usize,
    /// A lock blocked by holds on other paths: `blocked by descendant a/b`.
    pub blocked: Option<String>,
    /// (host, pid, granted at: ns since the Unix epoch, as the server stamped the grant) of
    /// each holder, in grant order. The time held is counted from it whenever the line is
    /// drawn, so it moves with every redraw, not only when the holders are read again.
    pub holders: Vec<(String, String, i64)>,
}

/// Whole seconds, `0s` included.
fn secs(d: Duration) -> String {
    match d.as_secs() {
        0 => "0s".to_string(),
        n => format_duration(Duration::from_secs(n)),
    }
}

/// The status text: `waiting 5s for x[1]: next in line; held by node2 pid 4242 for 12s`, the
/// time held counted up to `now_nanos` (ns since the Unix epoch).
pub(crate) fn render(
    label: &str,
    waited: Duration,
    standing: Option<&Standing>,
    now_nanos: i64,
) -> String {
    let waited = secs(waited);
    let mut text = format!("conch: waiting {waited} for {label}");
    let Some(s) = standing else {
        return text;
    };
    match s.position {
        Some(0) => text.push_str(": next in line"),
        Some(p) => text.push_str(&format!(": position {} of {}", p + 1, s.queued)),
        None => text.push_str(": queueing"),
    }
    if let Some(blocked) = &s.blocked {
        text.push_str("; ");
        text.push_str(blocked);
    }
    if !s.holders.is_empty() {
        let held: Vec<String> = s
            .holders
            .iter()
            .map(|(host, pid, at)| {
                format!("{host} pid {pid} for {}", secs(between(*at, now_nanos)))
            })
            .collect();
        text.push_str(&format!("; held by {}", held.join(", ")));
    }
    text
}

/// (host, pid) of a holder or waiter, from the metadata conch gives it (`?` where missing).
pub(crate) fn host_pid(m: &std::collections::HashMap<String, String>) -> (String, String) {
    use conch_client::sema::{META_HOST, META_PID};
    let get = |k: &str| m.get(k).cloned().unwrap_or_else(|| "?".to_string());
    (get(META_HOST), get(META_PID))
}

/// Now, in ns since the Unix epoch.
pub(crate) fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The time from `from` to `to` (ns since the Unix epoch); zero if `to` is earlier.
fn between(from: i64, to: i64) -> Duration {
    Duration::from_nanos(u64::try_from(to.saturating_sub(from)).unwrap_or(0))
}

/// Reads the queue and holders of `semaphore` for the line.
pub(crate) async fn semaphore_standing(
    client: &Client,
    namespace: &str,
    semaphore: &str,
    lease_id: &str,
) -> Option<Standing> {
    let read = async {
        let holders = client.list_holders(namespace, semaphore).await.ok()?;
        let waiters = client.list_waiters(namespace, semaphore).await.ok()?;
        Some((holders, waiters))
    };
    let (holders, waiters) = tokio::time::timeout(FETCH_TIMEOUT, read).await.ok()??;
    let position = waiters
        .waiters
        .iter()
        .enumerate()
        .find(|(_, w)| w.lease_id == lease_id)
        .map(|(i, w)| {
            if w.position == 0 {
                i as u64
            } else {
                w.position
            }
        });
    Some(Standing {
        position,
        queued: waiters.waiters.len(),
        blocked: None,
        holders: holders
            .iter()
            .map(|h| {
                let (host, pid) = host_pid(&h.metadata);
                (host, pid, h.locked_at)
            })
            .collect(),
    })
}

/// The width of the terminal on stderr (else `COLUMNS`, else 80).
fn width() -> usize {
    let mut ws = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct it is given, which lives here.
    let r = unsafe { nix::libc::ioctl(2, nix::libc::TIOCGWINSZ, &mut ws) };
    if r == 0 && ws.ws_col > 0 {
        return usize::from(ws.ws_col);
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse().ok())
        .filter(|c| *c > 0)
        .unwrap_or(80)
}

/// The line on the terminal; erased when dropped (the slot came, or the wait ended otherwise).
struct Line {
    drawn: bool,
}

impl Line {
    fn draw(&mut self, text: &str) {
        // Cut below the width, so the line never wraps and one erase removes it all.
        let room = width().saturating_sub(1);
        let text: String = text.chars().take(room).collect();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{text}").and_then(|()| err.flush());
        self.drawn = true;
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K").and_then(|()| err.flush());
        }
    }
}

/// Runs `wait` (the queueing), showing where it stands meanwhile as the mode says; `fetch`
/// reads where it stands.
pub(crate) async fn show_while<F: Future, S: Future<Output = Option<Standing>>>(
    label: &str,
    fetch: impl Fn() -> S,
    wait: F,
) -> F::Output {
    let mode = mode();
    if mode == Mode::Off {
        return wait.await;
    }
    tokio::pin!(wait);
    let start = Instant::now();
    let mut line = Line { drawn: false };
    let mut standing: Option<Standing> = None;
    let mut next_fetch = tokio::time::Instant::now() + FIRST_AFTER;
    let mut next_draw = tokio::time::Instant::now() + FIRST_AFTER;
    loop {
        tokio::select! {
            out = &mut wait => return out,
            _ = tokio::time::sleep_until(next_fetch.min(next_draw)) => {}
        }
        let now = tokio::time::Instant::now();
        if now >= next_fetch {
            tokio::select! {
                out = &mut wait => return out,
                s = tokio::time::timeout(FETCH_TIMEOUT, fetch()) => {
                    let s = s.ok().flatten();
                    if s.is_some() {
                        standing = s;
                    }
                }
            }
            next_fetch = tokio::time::Instant::now() + FETCH_EVERY;
        }
        if tokio::time::Instant::now() >= next_draw {
            let text = render(label, start.elapsed(), standing.as_ref(), now_nanos());
            match mode {
                Mode::Line => {
                    line.draw(&text);
                    next_draw = tokio::time::Instant::now() + REDRAW_EVERY;
                }
                _ => {
                    eprintln!("{text}");
                    next_draw = tokio::time::Instant::now() + PLAIN_EVERY;
                    next_fetch = next_fetch.max(next_draw - Duration::from_millis(100));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grant time as the server stamps it (ns since the Unix epoch).
    const GRANTED: i64 = 1_781_000_000_000_000_000;

    #[test]
    fn the_text_says_position_holders_and_time() {
        let s = Standing {
            position: Some(1),
            queued: 3,
            blocked: None,
            holders: vec![("node2".into(), "4242".into(), GRANTED)],
        };
        assert_eq!(
            render(
                "x[1]",
                Duration::from_millis(5_900),
                Some(&s),
                GRANTED + 72_400_000_000
            ),
            "conch: waiting 5s for x[1]: position 2 of 3; held by node2 pid 4242 for 1m12s"
        );
        let next = Standing {
            position: Some(0),
            queued: 1,
            blocked: None,
            holders: vec![],
        };
        assert_eq!(
            render("x[1]", Duration::ZERO, Some(&next), GRANTED),
            "conch: waiting 0s for x[1]: next in line"
        );
        assert_eq!(
            render("election b", Duration::from_secs(3), None, GRANTED),
            "conch: waiting 3s for election b"
        );
        let lock = Standing {
            position: Some(0),
            queued: 2,
            blocked: Some("blocked by descendant a/b".into()),
            holders: vec![("node3".into(), "77".into(), GRANTED)],
        };
        assert_eq!(
            render(
                "lock a (exclusive)",
                Duration::from_secs(2),
                Some(&lock),
                GRANTED + 4_000_000_000
            ),
            "conch: waiting 2s for lock a (exclusive): next in line; blocked by descendant a/b; held by node3 pid 77 for 4s"
        );
    }

    /// The time held is the server's grant time counted to each redraw: the same standing (read
    /// once) drawn a second later says a second more, not what it said when it was read.
    #[test]
    fn the_time_held_moves_between_reads() {
        let s = Standing {
            position: Some(0),
            queued: 1,
            blocked: None,
            holders: vec![("node2".into(), "4242".into(), GRANTED)],
        };
        let at = |secs: i64| {
            render(
                "x[1]",
                Duration::ZERO,
                Some(&s),
                GRANTED + secs * 1_000_000_000,
            )
        };
        assert!(
            at(12).ends_with("held by node2 pid 4242 for 12s"),
            "{}",
            at(12)
        );
        assert!(
            at(13).ends_with("held by node2 pid 4242 for 13s"),
            "{}",
            at(13)
        );
        // A grant stamped by a clock a little ahead of this one is "0s", not a panic.
        assert!(
            at(-2).ends_with("held by node2 pid 4242 for 0s"),
            "{}",
            at(-2)
        );
    }
}
