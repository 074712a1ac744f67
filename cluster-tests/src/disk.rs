//! A small disk for one node: a tmpfs of a fixed size mounted for the node's data directory,
//! which a test fills up (a filler file written until `ENOSPC`) and frees again.
//!
//! Mounting needs root (CI machines run the tests as root); [`mount_works`] says whether it
//! does here. The tmpfs is unmounted on drop (lazily, so a process still holding a file in it
//! cannot keep it mounted).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// conchd's exit status when its storage fails while serving (e.g. the disk is full).
pub const CONCHD_EXIT_STORAGE: i32 = 74;

pub struct SmallDisk {
    pub mount: PathBuf,
    mounted: bool,
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl SmallDisk {
    /// Mounts a tmpfs of `bytes` at `mount` (created if missing).
    pub fn mount(mount: &Path, bytes: u64) -> anyhow::Result<SmallDisk> {
        std::fs::create_dir_all(mount).with_context(|| mount.display().to_string())?;
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(mount))?;
        Ok(SmallDisk {
            mount: mount.to_path_buf(),
            mounted: true,
        })
    }

    fn filler(&self) -> PathBuf {
        self.mount.join("filler")
    }

    /// Writes a filler file until the disk is full; returns the bytes written.
    pub fn fill(&self) -> anyhow::Result<u64> {
        let path = self.filler();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| path.display().to_string())?;
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => return Err(e).with_context(|| path.display().to_string()),
            }
        }
        // Partial chunks fill what is left.
        while let Ok(n) = file.write(&chunk[..512]) {
            if n == 0 {
                break;
            }
            written += n as u64;
        }
        Ok(written)
    }

    /// Deletes the filler file: the space is back.
    pub fn free(&self) -> anyhow::Result<()> {
        match std::fs::remove_file(self.filler()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| self.filler().display().to_string())
            }
            _ => Ok(()),
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).output();
            self.mounted = false;
        }
    }
}

/// Whether a tmpfs can be mounted here (tries a 1 MiB one); the error says why not.
pub fn mount_works() -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("conch-disk-probe-")
        .tempdir()
        .context("tempdir")?;
    let disk = SmallDisk::mount(&dir.path().join("mnt"), 1 << 20)?;
    drop(disk);
    Ok(())
}
