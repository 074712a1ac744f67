//! The subcommands that hold something while running a command, or show who holds it: `sema`
//! (slots of one or more semaphores), `lock` (hierarchical locks) and `elect` (leadership).

use std::time::Duration;

use clap::Args;

use super::values::{
    Wait, duration_arg, lock_path_arg, max_hold_arg, namespace_arg, priority_arg, ttl_arg, wait_arg,
};

pub(super) const SEMA_EXAMPLES: &str = "\
Examples:
  # classic lock around a mutating script
  conch sema certs-renew --max 1 --nonblock -- ./renew.sh || echo \"already running elsewhere\"

  # at most 2 nodes run heavy tasks concurrently
  conch sema heavy-jobs --max 2 -- /usr/local/bin/run-job.sh

  # inspect
  conch sema heavy-jobs --max 2 --who

  # a nightly report may not keep a warehouse slot more than 2 hours, even if it hangs
  conch sema warehouse --max 2 --max-hold 2h -- ./nightly-report.sh

  # all or none: a slot of gpu[1] AND two of licences[3], taken in one grant
  conch sema gpu --max 1 --and licences --max 3 --weight 2 -- ./train.sh

Each --and NAME starts another member of the same run; the --max and --weight after it are
that member's (--weight: permits taken, default 1). The members are taken all at once or not
at all: a run that cannot have all waits, as one entry in every member's FIFO queue, holding
none of them, so runs wanting {a, b} and {b, a} never deadlock, and a single `conch sema b`
arriving later waits behind the set. CONCH_REV is then the first member's token and
CONCH_REVS lists every member's, e.g. CONCH_REVS=gpu=12,licences=7.

The command runs with CONCH_REV (the grant's fencing token, strictly increasing cluster-wide)
and CONCH_LEASE (the lease id) in its environment, in a process group of its own: conch
forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to that group. Like `timeout`,
this means the command cannot read from the terminal.

The semaphore is <NAME>.<N> in the namespace conch, or --namespace NS (CONCH_NAMESPACE): one
namespace per team, where only the team's tokens may write, keeps other teams' tokens from
changing it. The command does not see CONCH_TOKEN, CONCH_TOKEN_FILE, CONCH_CERT or CONCH_KEY.

If the lease cannot be kept alive while the command runs (the cluster is unreachable for
about the TTL, or the lease was revoked), or the semaphore is deleted or its permits changed
from N (checked about every TTL/3), conch says so on stderr, sends SIGTERM to the command's
process group, SIGKILL after --kill-after, and exits 79. It gives up before the server can
expire the lease, but a new holder may start while the old command is still stopping:
commands must be idempotent or crash-tolerant.

Exit status:
  the command's     the command ran (128+N if it was killed by signal N)
  0 / 1             --who: someone holds the semaphore / nobody does (the holders, or
                    \"no holder\", are printed either way)
  64                usage error, or a --token-file or --key that group or others may read
  69                no conch node answered (within --wait, when one is given)
  70                internal error (unexpected answer from the cluster), or the semaphore
                    no longer has N permits (changed through the API)
  75                busy: no slot within --wait (at once with --nonblock)
  77                access control: no token, an unknown or revoked one, no acquire
                    permission on the namespace, or a namespace that does not exist and
                    that this token may not create
  78                the TLS settings are wrong: an unusable --cacert/--cert/--key, TLS to a
                    plaintext node or back, a certificate the other side refuses
  79                slot lost while running: lease lost, semaphore deleted or resized
  80                the hold limit (--max-hold, or the semaphore's) was reached: the
                    command was stopped before the server ended the hold
  81                an administrator revoked the slot (`conch revoke`): the command was
                    stopped, and who revoked it and why were printed
  82                a quota or limit refused it (namespace quota full, 1000 holders):
                    waiting does not help
  126 / 127         the command could not be executed / was not found";

#[derive(Debug, Args)]
pub(crate) struct SemaArgs {
    /// Semaphore name: letters, digits, '-', '_' and '.'.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// The namespace the semaphore, its leases and holders live in (one per team keeps teams
    /// apart; see `conch namespace --help`).
    #[arg(long, value_name = "NS", env = "CONCH_NAMESPACE", default_value = conch_client::sema::NAMESPACE, value_parser = namespace_arg)]
    pub namespace: String,

    /// Capacity N: at most N holders at once, cluster-wide. Part of the identity: callers with
    /// different --max use different semaphores (--max 1 is a lock). After --and NAME: that
    /// member's capacity.
    #[arg(long, value_name = "N", required = true, action = clap::ArgAction::Append, value_parser = clap::value_parser!(u64).range(1..=conch_client::sema::MAX_PERMITS))]
    pub max: Vec<u64>,

    /// All or none: also take a slot of semaphore NAME, in the same grant; the --max (and
    /// --weight) after it are its own. Repeatable (at most 16 members in all).
    #[arg(long = "and", value_name = "NAME", action = clap::ArgAction::Append, conflicts_with_all = ["who", "spread"])]
    pub and: Vec<String>,

    /// The permits taken (1 to --max; default 1): of the semaphore, or with --and of the
    /// member before it. A weighted semaphore: `--max 10 --weight 4` takes 4 of 10 permits.
    #[arg(long, value_name = "W", action = clap::ArgAction::Append, conflicts_with = "who", value_parser = clap::value_parser!(u64).range(1..=conch_client::sema::MAX_PERMITS))]
    pub weight: Vec<u64>,

    /// The members in order (the first is NAME), from --max, --and and --weight by their
    /// positions on the command line ([`SemaArgs::resolve_members`]).
    #[arg(skip)]
    pub members: Vec<Member>,

    /// Lease time to live (whole seconds, 1s-300s): a crashed conch's slot comes back after
    /// about this long.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = ttl_arg)]
    pub ttl: Duration,

    /// Longest wait for a slot [default: forever]; exit 75 if none comes in time. The wait
    /// keeps its place in the FIFO queue across request timeouts and node failover. It bounds
    /// the wall time even when the cluster cannot answer (no quorum: exit 69 when it passes).
    #[arg(long, value_name = "DURATION", value_parser = wait_arg, conflicts_with = "nonblock")]
    pub wait: Option<Wait>,

    /// Do not wait: run only if a slot is free now, else exit 75 (same as --wait 0).
    #[arg(long, short = 'n')]
    pub nonblock: bool,

    /// At most one slot per host: a host already holding one is refused as if no slot were
    /// free.
    #[arg(long)]
    pub spread: bool,

    /// When the slot is lost while the command runs: time between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_arg)]
    pub kill_after: Duration,

    /// Longest the command may hold the slot (1s-30d), however long its lease lives: the
    /// server ends the hold then and grants the next waiter. conch stops the command before,
    /// and exits 80: SIGTERM when a stop window of --kill-after + 1s is left, but the window is
    /// at most a tenth of the hold (at least 1s), so the command runs for at least 90% of a
    /// hold of 10s or more (--max-hold 10s: SIGTERM after 9s, SIGKILL half a second later; 2h:
    /// SIGTERM 6s before the end). A smaller limit set on the semaphore wins.
    #[arg(long, value_name = "DURATION", value_parser = max_hold_arg)]
    pub max_hold: Option<Duration>,

    /// Show who holds the slots and who waits, in grant and queue order, or "no holder"; exit
    /// 0 if anyone holds, 1 if nobody does.
    #[arg(long, conflicts_with_all = ["wait", "nonblock", "spread", "command"])]
    pub who: bool,

    /// With --who: print JSON.
    #[arg(long)]
    pub json: bool,

    /// The command to run, after `--`.
    #[arg(value_name = "CMD", last = true, required_unless_present = "who")]
    pub command: Vec<String>,
}

pub(super) const LOCK_EXAMPLES: &str = "\
Examples:
  # one migration of the orders tables at a time; it also waits for (and holds off) anything
  # under db/orders, and an exclusive hold of db
  conch lock db/orders -- ./migrate-orders.sh

  # readers share: many reports at once, but no migration of db/orders while they run
  conch lock db/orders/2026 --shared -- ./report.sh 2026

  # cron: skip this run if the lock is busy, saying what holds it
  conch lock backups/nightly --nonblock -- ./backup.sh || echo \"busy, skipped\"

  # who holds db, its ancestors and descendants, who waits, and what would block
  conch lock db --who
  conch lock db --who --json

Paths are '/'-separated (letters, digits, '-', '_', '.'; at most 256 characters) in the
namespace conch, or --namespace NS (CONCH_NAMESPACE). An exclusive hold (the default)
conflicts with every other hold on the same path, its ancestors (db of db/orders) and its
descendants (db/orders/2026); a --shared hold only with exclusive ones there. Siblings never
conflict. Waiters queue in one FIFO queue per namespace: a waiting exclusive acquire holds
back later shared ones that conflict with it, so a stream of readers cannot starve a writer.

The command runs with, in its environment:
  CONCH_REV         the grant's fencing token: strictly increasing per path (and cluster-wide)
                    from one holder to the next; pass it to what the lock protects so it can
                    refuse a stale holder
  CONCH_LEASE       the lock lease id
  CONCH_LOCK        the path
  CONCH_LOCK_MODE   exclusive or shared
in a process group of its own: conch forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
SIGUSR2 to that group, so the command cannot read from the terminal. It does not see
CONCH_TOKEN, CONCH_TOKEN_FILE, CONCH_CERT or CONCH_KEY. While conch waits, a status line on a
terminal says where it stands and what blocks it (-v: plain lines).

If the lease cannot be kept alive while the command runs (the cluster is unreachable for
about the TTL, or the lease was revoked), or the hold is dropped (DeleteLock, checked about
every TTL/3), conch says so on stderr, sends SIGTERM to the command's process group, SIGKILL
after --kill-after, and exits 79. It gives up before the server can expire the lease, but a
new holder may start while the old command is still stopping: check CONCH_REV where it
matters.

Exit status:
  the command's     the command ran (128+N if it was killed by signal N)
  0 / 1             --who: the path, an ancestor or a descendant is held / none is
  64                usage error (a bad path, --json without --who, ...)
  69                no conch node answered
  75                no lock within --wait (at once with --nonblock); the message names
                    the reason (peer, ancestor, descendant) and the paths in the way
  77                access control: no token, an unknown or revoked one, no permission on
                    the namespace, or a namespace that does not exist and that this token
                    may not create
  79                lock lost while running: lease lost, or the hold dropped (DeleteLock)
  81                the lock was revoked by an administrator (`conch revoke lock`); the
                    reason was printed
  126 / 127         the command could not be executed / was not found";

#[derive(Debug, Args)]
pub(crate) struct LockArgs {
    /// Lock path: '/'-separated segments of letters, digits, '-', '_' and '.'.
    #[arg(value_name = "PATH", value_parser = lock_path_arg)]
    pub path: String,

    /// The namespace the lock, its lease and holders live in (one per team keeps teams apart;
    /// see `conch namespace --help`).
    #[arg(long, value_name = "NS", env = "CONCH_NAMESPACE", default_value = conch_client::sema::NAMESPACE, value_parser = namespace_arg)]
    pub namespace: String,

    /// Hold the lock shared (readers): other shared holds of the path, its ancestors and
    /// descendants may run beside it, exclusive ones may not. Without it the hold is exclusive.
    #[arg(long)]
    pub shared: bool,

    /// Lease time to live (whole seconds, 1s-300s): a crashed conch's lock comes back after
    /// about this long.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = ttl_arg)]
    pub ttl: Duration,

    /// Longest wait for the lock [default: forever]; exit 75 if it does not come in time. The
    /// wait keeps its place in the FIFO queue across request timeouts and node failover.
    #[arg(long, value_name = "DURATION", value_parser = wait_arg, conflicts_with = "nonblock")]
    pub wait: Option<Wait>,

    /// Do not wait: run only if the lock is free now, else exit 75 (same as --wait 0).
    #[arg(long, short = 'n')]
    pub nonblock: bool,

    /// When the lock is lost while the command runs: time between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_arg)]
    pub kill_after: Duration,

    /// Show the holds on the path, its ancestors and descendants, the acquires queued there,
    /// and what an acquire of the path (exclusive, or --shared) would wait for, or that nothing
    /// is held there; exit 0 either way.
    #[arg(long, conflicts_with_all = ["wait", "nonblock", "command"])]
    pub who: bool,

    /// With --who: print JSON.
    #[arg(long)]
    pub json: bool,

    /// The command to run, after `--`.
    #[arg(value_name = "CMD", last = true, required_unless_present = "who")]
    pub command: Vec<String>,
}

impl LockArgs {
    /// Checks what clap cannot express.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.json && !self.who {
            return Err("--json goes with --who".to_string());
        }
        Ok(())
    }

    /// The wait bound: `None` is forever.
    pub(crate) fn wait_bound(&self) -> Option<Duration> {
        if self.nonblock {
            Some(Duration::ZERO)
        } else {
            self.wait.and_then(|w| w.0)
        }
    }
}

pub(super) const ELECT_EXAMPLES: &str = "\
Examples:
  # run the billing scheduler on exactly one of the hosts that run this line
  conch elect billing --value \"$(hostname):8080\" -- ./scheduler

  # who leads, then the candidates in the order they take over
  conch elect billing --who

  # one line per change of leader, until interrupted
  conch elect billing --observe --json

  # prefer this host: the current leader hands over when this candidate joins
  conch elect billing --priority 10 -- ./scheduler

Candidates queue in FIFO order for a 1-permit semaphore (billing.elect in the namespace
conch, or --namespace NS). The leader runs the command with CONCH_REV (the fencing token of
its term, strictly increasing cluster-wide), CONCH_LEASE and CONCH_LEADER_VALUE (its --value)
in its environment; when the command exits or the leader loses its lease, the next candidate
takes over. SIGTERM or SIGINT to a leader's conch stops the command (SIGKILL after
--kill-after), then gives leadership back at once, so the next candidate starts without
waiting for the TTL. A candidate of higher --priority is preferred: the leader stops its
command and hands over, then stands again. A leader that cannot keep its lease alive (or whose conch is stopped), or whose
election semaphore is deleted or given other than 1 permit, stops its command: SIGTERM,
SIGKILL after --kill-after. conch gives up before the server can expire the lease, but a
command slower to stop than that margin may overlap the next leader: check CONCH_REV where
it matters.

Exit status:
  the command's     the command ran as leader (128+N if it was killed by signal N)
  0 / 1             --who: there is a leader / there is none
  64                usage error
  69                no conch node answered
  75                not leader within --wait
  77                access control refused the call
  79                leadership lost while running (lease lost, semaphore deleted or resized)
  81                leadership revoked by an administrator (`conch revoke elect`); the
                    reason was printed
  126 / 127         the command could not be executed / was not found";

#[derive(Debug, Args)]
pub(crate) struct ElectArgs {
    /// Election name: letters, digits, '-', '_' and '.'.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// The namespace the election's semaphore, leases and candidates live in.
    #[arg(long, value_name = "NS", env = "CONCH_NAMESPACE", default_value = conch_client::sema::NAMESPACE, value_parser = namespace_arg)]
    pub namespace: String,

    /// What this candidate announces as leader (e.g. its address); shown by --who and
    /// --observe, and given to the command as CONCH_LEADER_VALUE [default: the host name].
    #[arg(long, value_name = "V")]
    pub value: Option<String>,

    /// Lease time to live (whole seconds, 1s-300s): a crashed leader is succeeded after about
    /// this long.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = ttl_arg)]
    pub ttl: Duration,

    /// When leadership is lost or handed over while the command runs, or conch gets SIGTERM or
    /// SIGINT: time between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_arg)]
    pub kill_after: Duration,

    /// Longest wait to become leader [default: forever]; exit 75 if it does not come in time.
    #[arg(long, value_name = "DURATION", value_parser = wait_arg)]
    pub wait: Option<Wait>,

    /// Preference among candidates (0-1000000): a leader hands leadership to a waiting
    /// candidate of higher priority (within a third of --ttl of its joining), then stands
    /// again behind it. Equal priorities keep queue order.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = priority_arg)]
    pub priority: u32,

    /// Show the leader, then the candidates in the order they would take over, or "no
    /// leader"; exit 0 either way.
    #[arg(long, conflicts_with_all = ["observe", "value", "wait", "priority", "command"])]
    pub who: bool,

    /// Print one line per change of leader (time, value, host, pid, fencing token), starting
    /// with the current one, until interrupted. Waits on the server, not by polling, and
    /// follows the cluster across node failures.
    #[arg(long, conflicts_with_all = ["value", "wait", "priority", "command"])]
    pub observe: bool,

    /// With --who or --observe: print JSON (--observe: one object per line).
    #[arg(long)]
    pub json: bool,

    /// The command to run while leader, after `--`.
    #[arg(value_name = "CMD", last = true, required_unless_present_any = ["who", "observe"])]
    pub command: Vec<String>,
}

impl ElectArgs {
    /// Checks what clap cannot express.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.json && !self.who && !self.observe {
            return Err("--json goes with --who or --observe".to_string());
        }
        Ok(())
    }
}

/// One member of a `conch sema` run: a semaphore NAME, its capacity and the permits taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub name: String,
    pub max: u64,
    pub weight: u64,
}

/// Most members of one `conch sema` run (the server's limit on a set).
pub(super) const MEMBERS_MAX: usize = 16;

impl SemaArgs {
    /// Checks what clap cannot express.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.json && !self.who {
            return Err("--json goes with --who".to_string());
        }
        if self.members.is_empty() {
            return Err("no semaphore to take".to_string());
        }
        Ok(())
    }

    /// The first member's capacity (`--max` before any `--and`).
    pub(crate) fn first_max(&self) -> u64 {
        self.members
            .first()
            .map_or_else(|| self.max.first().copied().unwrap_or(1), |m| m.max)
    }

    /// Groups --max, --and and --weight by their positions in `matches` (the `sema`
    /// subcommand's): each --and NAME starts a member, and a --max or --weight belongs to the
    /// member named last before it (NAME itself before the first --and).
    pub(crate) fn resolve_members(&mut self, matches: &clap::ArgMatches) -> Result<(), String> {
        enum Part {
            Max(u64),
            And(String),
            Weight(u64),
        }
        let mut parts: Vec<(usize, Part)> = Vec::new();
        let indices = |id: &str| -> Vec<usize> {
            matches
                .indices_of(id)
                .map(|i| i.collect())
                .unwrap_or_default()
        };
        parts.extend(
            indices("max")
                .into_iter()
                .zip(self.max.iter())
                .map(|(i, v)| (i, Part::Max(*v))),
        );
        parts.extend(
            indices("and")
                .into_iter()
                .zip(self.and.iter())
                .map(|(i, v)| (i, Part::And(v.clone()))),
        );
        parts.extend(
            indices("weight")
                .into_iter()
                .zip(self.weight.iter())
                .map(|(i, v)| (i, Part::Weight(*v))),
        );
        parts.sort_by_key(|(i, _)| *i);
        let mut members: Vec<(String, Option<u64>, Option<u64>)> =
            vec![(self.name.clone(), None, None)];
        for (_, part) in parts {
            let Some(current) = members.last_mut() else {
                continue;
            };
            match part {
                Part::And(name) => members.push((name, None, None)),
                Part::Max(max) if current.1.is_none() => current.1 = Some(max),
                Part::Weight(weight) if current.2.is_none() => current.2 = Some(weight),
                Part::Max(_) => {
                    return Err(format!(
                        "--max is given twice for {}: each member takes one --max (start another \
                         member with --and NAME)",
                        current.0
                    ));
                }
                Part::Weight(_) => {
                    return Err(format!("--weight is given twice for {}", current.0));
                }
            }
        }
        if members.len() > MEMBERS_MAX {
            return Err(format!(
                "at most {MEMBERS_MAX} semaphores in one run, got {}",
                members.len()
            ));
        }
        let mut resolved = Vec::with_capacity(members.len());
        for (name, max, weight) in members {
            conch_client::sema::validate_name("semaphore", &name)?;
            let Some(max) = max else {
                return Err(format!("--max N is missing for {name}"));
            };
            let weight = weight.unwrap_or(1);
            if weight > max {
                return Err(format!(
                    "--weight {weight} of {name} exceeds its --max {max}"
                ));
            }
            if resolved.iter().any(|m: &Member| m.name == name) {
                return Err(format!(
                    "{name} is named twice: each member of a run must be a different semaphore"
                ));
            }
            resolved.push(Member { name, max, weight });
        }
        self.members = resolved;
        Ok(())
    }

    /// The wait bound: `None` is forever.
    pub(crate) fn wait_bound(&self) -> Option<Duration> {
        if self.nonblock {
            Some(Duration::ZERO)
        } else {
            self.wait.and_then(|w| w.0)
        }
    }
}
