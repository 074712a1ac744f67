//! `<data_dir>/vote`: the copy of the vote outside sled, compared with sled's at open.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use openraft::Vote;

use super::{fsync_dir, io_other};
use crate::raft::NodeId;
use crate::raft::codec::{decode_value, encode_value};

/// `<data_dir>/vote`: a second copy of the vote, outside sled. sled recovers silently from
/// damage by dropping what follows it, which could make a node forget its vote (and vote twice
/// in a term) or its whole log; comparing with this file at open turns that into a refusal.
pub(super) fn vote_file_path(data_dir: &Path) -> PathBuf {
    data_dir.join("vote")
}

pub(super) fn write_vote_file(data_dir: &Path, vote: &Vote<NodeId>) -> io::Result<()> {
    let bytes = encode_value(vote).map_err(io_other)?;
    let path = vote_file_path(data_dir);
    let tmp = path.with_extension("tmp");
    {
        let mut file = File::create(&tmp)?;
        io::Write::write_all(&mut file, &bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    fsync_dir(data_dir)
}

pub(super) fn read_vote_file(data_dir: &Path) -> Result<Option<Vote<NodeId>>, String> {
    let path = vote_file_path(data_dir);
    match std::fs::read(&path) {
        Ok(bytes) => decode_value(&bytes)
            .map(Some)
            .map_err(|e| format!("vote file {}: {e}", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("read vote file {}: {e}", path.display())),
    }
}
