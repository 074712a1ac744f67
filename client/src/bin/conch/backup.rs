//! `conch cluster backup FILE`: a consistent backup of the replicated state, streamed from any
//! node (`ConchAdmin.Backup`), checked on receipt (SHA-256, format, lengths) and written
//! atomically: into a temporary file next to FILE, synced, then renamed over FILE. `-` writes
//! the file to stdout once it is checked, and the summary line to stderr.
//!
//! One line when done: `backup of log index 120 (term 3), state hash 5d1c…, 4242 bytes: FILE`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use conch_client::proto::backup::{Verified, Verifier};
use conch_client::proto::conch::BackupRequest;
use conch_client::proto::conch::conch_admin_client::ConchAdminClient;
use conch_client::{CallOptions, Client, request};

use crate::exit;

/// The least deadline of the call: the stream of a large state takes longer than a request.
const BACKUP_TIMEOUT_MIN: Duration = Duration::from_secs(120);

/// Where the received bytes go until they are checked.
enum Sink {
    Stdout(Vec<u8>),
    File {
        tmp: PathBuf,
        file: std::fs::File,
        target: PathBuf,
    },
}

fn write_error(path: &Path, e: std::io::Error) -> anyhow::Error {
    exit::usage(format!("write {}: {e}", path.display()))
}

impl Sink {
    fn open(target: &str) -> anyhow::Result<Sink> {
        if target == "-" {
            return Ok(Sink::Stdout(Vec::new()));
        }
        let target = PathBuf::from(target);
        let name = target
            .file_name()
            .ok_or_else(|| exit::usage(format!("{}: not a file name", target.display())))?;
        let dir = match target.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let prefix = format!(".{}.tmp-", name.to_string_lossy());
        remove_stale_temporaries(&dir, &prefix);
        let tmp = dir.join(format!("{prefix}{}", std::process::id()));
        // Owner only (0600), like tokens: a backup holds the whole state, the access control's
        // token hashes and roles included. The mode is set at creation, so the data is never
        // readable by others, and the rename keeps it.
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| write_error(&tmp, e))?
        };
        Ok(Sink::File { tmp, file, target })
    }

    fn write(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        match self {
            Sink::Stdout(buffer) => buffer.extend_from_slice(bytes),
            Sink::File { tmp, file, .. } => {
                file.write_all(bytes).map_err(|e| write_error(tmp, e))?
            }
        }
        Ok(())
    }

    /// Removes the temporary file of a backup that is not kept.
    fn discard(self) {
        if let Sink::File { tmp, file, .. } = self {
            drop(file);
            let _ = std::fs::remove_file(tmp);
        }
    }

    /// Puts the checked backup in place; returns where it went.
    fn commit(self) -> anyhow::Result<String> {
        match self {
            Sink::Stdout(buffer) => {
                crate::print_out(&buffer)?;
                Ok("-".to_string())
            }
            Sink::File { tmp, file, target } => {
                let kept = file
                    .sync_all()
                    .and_then(|()| std::fs::rename(&tmp, &target));
                if let Err(e) = kept {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(write_error(&target, e));
                }
                let dir = match target.parent() {
                    Some(dir) if !dir.as_os_str().is_empty() => dir,
                    _ => Path::new("."),
                };
                if let Ok(dir) = std::fs::File::open(dir) {
                    let _ = dir.sync_all();
                }
                Ok(target.display().to_string())
            }
        }
    }
}

/// Removes `<prefix><pid>` files in `dir` left by a backup that was killed before it could
/// clean up: those whose process no longer runs. Best effort: a file it cannot remove stays.
fn remove_stale_temporaries(dir: &Path, prefix: &str) {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    for item in listing.flatten() {
        let name = item.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_file(item.path());
        }
    }
}

/// Streams the backup into `target` (a path, or `-`), checking it on the way.
pub(crate) async fn run(client: &Client, target: &str) -> anyhow::Result<ExitCode> {
    let mut sink = Sink::open(target)?;
    let received = receive(client, &mut sink).await;
    let verified = match received {
        Ok(verified) => verified,
        Err(e) => {
            sink.discard();
            return Err(e);
        }
    };
    let to_stdout = matches!(sink, Sink::Stdout(_));
    let path = sink.commit()?;
    let h = &verified.header;
    let line = format!(
        "backup of log index {} (term {}), state hash {:016x}, {} bytes: {path}",
        h.applied_index, h.applied_term, h.state_hash, verified.len
    );
    if to_stdout {
        eprintln!("{line}");
    } else {
        crate::print_lines([line])?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn receive(client: &Client, sink: &mut Sink) -> anyhow::Result<Verified> {
    let defaults = client.default_options();
    let opts = CallOptions {
        timeout: defaults.timeout.max(BACKUP_TIMEOUT_MIN),
        retry_for: defaults.retry_for,
    };
    let mut stream = client
        .call("backup", opts, |ch, t| async move {
            ConchAdminClient::new(ch)
                .backup(request(BackupRequest {}, t))
                .await
        })
        .await?;
    let mut verifier = Verifier::new();
    loop {
        match stream.message().await {
            Ok(Some(chunk)) => {
                verifier.push(&chunk.data);
                sink.write(&chunk.data)?;
            }
            Ok(None) => break,
            Err(status) => return Err(conch_client::Error::from_status("backup", status).into()),
        }
    }
    verifier.finish().map_err(|e| {
        exit::Exit {
            code: exit::SOFTWARE,
            message: format!("the backup received is not usable (nothing written): {e}"),
        }
        .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporaries_of_dead_backups_are_removed_and_live_ones_kept() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = |name: &str| dir.path().join(name);
        // No Linux process has this id (pid_max is at most 2^22).
        std::fs::write(path(".b.conch.tmp-999999999"), b"partial")?;
        let live = format!(".b.conch.tmp-{}", std::process::id());
        std::fs::write(path(&live), b"in progress")?;
        for other in [".b.conch.tmp-x", ".other.tmp-999999999", "b.conch"] {
            std::fs::write(path(other), b"not ours")?;
        }
        let sink = Sink::open(&path("b.conch").display().to_string())?;
        assert!(
            !path(".b.conch.tmp-999999999").exists(),
            "stale temporary kept"
        );
        for kept in [
            live.as_str(),
            ".b.conch.tmp-x",
            ".other.tmp-999999999",
            "b.conch",
        ] {
            assert!(path(kept).exists(), "{kept} removed");
        }
        sink.discard();
        Ok(())
    }
}
