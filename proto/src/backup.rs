//! The backup file: a consistent copy of the replicated state, as `conch cluster backup` writes
//! it and `conchd restore` reads it. The `ConchAdmin.Backup` stream carries exactly these bytes.
//!
//! Layout, integers little-endian:
//!
//! ```text
//! header (72 bytes):
//!   "CONCHBAK" | format version u32 (1 or 2) | data format u32 | applied index u64 |
//!   applied term u64 | state hash u64 | created at (wall ns) i64 | state_len u64 |
//!   cluster id (16 bytes, zero when none)
//! format 2 only: release_len u8 | the release that wrote the file (release_len bytes, UTF-8)
//! state (state_len bytes): the state's canonical encoding, as in a snapshot
//! trailer (32 bytes): SHA-256 of everything before it
//! ```
//!
//! Format 1 is what release 0.1.0 writes and reads; a later release writes it too while its
//! cluster still runs at 0.1.0's cluster version (data format 7), so that 0.1.0 can restore the
//! backup, and writes format 2, which records its release, from data format 8 on.
//!
//! The checksum is checked first, before any other field is believed, so a damaged file is
//! always reported as such. The state hash is the state machine's own (FNV-1a 64 of the state
//! bytes); a reader that decodes the state recomputes it. The data format is the layout of the
//! state bytes: a build restores only its own.

use sha2::{Digest, Sha256};

/// The first bytes of every backup file.
pub const MAGIC: &[u8; 8] = b"CONCHBAK";
/// The newest layout written and read; every layout from 1 on is read.
pub const FORMAT_VERSION: u32 = 2;
/// The fixed part of the header (format 2 follows it with the release).
pub const HEADER_LEN: usize = 72;
/// The longest release name format 2 records.
pub const RELEASE_MAX: usize = 64;
/// The SHA-256 at the end.
pub const TRAILER_LEN: usize = 32;

/// What a backup file says about the state it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The layout of the state bytes (the daemon's data format).
    pub data_format: u32,
    /// The log index of the last entry the state includes.
    pub applied_index: u64,
    /// The term of that entry.
    pub applied_term: u64,
    /// The state machine's hash of the state.
    pub state_hash: u64,
    /// When the copy was taken, by the wall clock of the node that took it (informational).
    pub created_at_ns: i64,
    pub state_len: u64,
    /// The cluster the copy was taken from (zero when it had none).
    pub cluster_id: [u8; 16],
    /// The release that wrote the file: empty in format 1, which does not record it (a file
    /// of 0.1.0, or of a later release while its cluster ran at 0.1.0's cluster version).
    pub release: String,
}

/// Why bytes are not a usable backup file.
#[derive(Debug, PartialEq, Eq)]
pub enum BackupError {
    /// The file is compressed (`format`), as `conch cluster backup - | gzip` makes it.
    Compressed {
        format: &'static str,
        tool: &'static str,
    },
    TooShort {
        len: u64,
    },
    Checksum {
        stored: String,
        computed: String,
    },
    Magic,
    Version {
        found: u32,
    },
    Length {
        state_len: u64,
        present: u64,
    },
}

impl std::fmt::Display for BackupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackupError::Compressed { format, tool } => write!(
                f,
                "this file is {format}-compressed: decompress it first (e.g. `{tool} -dk FILE`) \
                 and restore the result"
            ),
            BackupError::TooShort { len } => write!(
                f,
                "not a complete backup file ({len} bytes; at least {} expected)",
                HEADER_LEN + TRAILER_LEN
            ),
            BackupError::Checksum { stored, computed } => write!(
                f,
                "checksum mismatch: the backup is damaged or incomplete (SHA-256 stored \
                 {stored}, computed {computed})"
            ),
            BackupError::Magic => write!(f, "not a conch backup file (bad magic)"),
            BackupError::Version { found } => write!(
                f,
                "backup format version {found}, written by a newer release of conch; this \
                 build reads versions 1 to {FORMAT_VERSION}: restore it with the release that \
                 wrote it, or a later one"
            ),
            BackupError::Length { state_len, present } => write!(
                f,
                "the header announces {state_len} bytes of state, the file holds {present}"
            ),
        }
    }
}

impl std::error::Error for BackupError {}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A cluster id (32 hex digits) as the header stores it; zero for anything else.
pub fn cluster_id_bytes(id: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    if id.len() != 32 {
        return out;
    }
    for (i, slot) in out.iter_mut().enumerate() {
        match u8::from_str_radix(id.get(2 * i..2 * i + 2).unwrap_or("zz"), 16) {
            Ok(b) => *slot = b,
            Err(_) => return [0u8; 16],
        }
    }
    out
}

fn word<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

impl Header {
    /// The header's bytes: format 1 without a release, format 2 with it (cut to
    /// [`RELEASE_MAX`] bytes at a character boundary).
    pub fn encode(&self) -> Vec<u8> {
        let mut release = self.release.as_str();
        while release.len() > RELEASE_MAX {
            let mut cut = RELEASE_MAX;
            while !release.is_char_boundary(cut) {
                cut -= 1;
            }
            release = &release[..cut];
        }
        let version: u32 = if release.is_empty() { 1 } else { 2 };
        let mut out = vec![0u8; HEADER_LEN];
        out[..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&version.to_le_bytes());
        out[12..16].copy_from_slice(&self.data_format.to_le_bytes());
        out[16..24].copy_from_slice(&self.applied_index.to_le_bytes());
        out[24..32].copy_from_slice(&self.applied_term.to_le_bytes());
        out[32..40].copy_from_slice(&self.state_hash.to_le_bytes());
        out[40..48].copy_from_slice(&self.created_at_ns.to_le_bytes());
        out[48..56].copy_from_slice(&self.state_len.to_le_bytes());
        out[56..72].copy_from_slice(&self.cluster_id);
        if version == 2 {
            out.push(release.len() as u8);
            out.extend_from_slice(release.as_bytes());
        }
        out
    }

    /// Reads a header whose checksum was already checked, from the first bytes of the file
    /// (at least [`HEADER_LEN`]); returns it with its length.
    fn decode(bytes: &[u8]) -> Result<(Header, usize), BackupError> {
        if &bytes[..8] != MAGIC {
            return Err(BackupError::Magic);
        }
        let version = u32::from_le_bytes(word(bytes, 8));
        let (release, len) = match version {
            1 => (String::new(), HEADER_LEN),
            2 => {
                let release_len = usize::from(bytes.get(HEADER_LEN).copied().unwrap_or(0));
                let end = HEADER_LEN + 1 + release_len;
                let release = bytes
                    .get(HEADER_LEN + 1..end)
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .filter(|r| !r.is_empty())
                    .ok_or(BackupError::Magic)?;
                (release.to_string(), end)
            }
            found => return Err(BackupError::Version { found }),
        };
        let header = Header {
            data_format: u32::from_le_bytes(word(bytes, 12)),
            applied_index: u64::from_le_bytes(word(bytes, 16)),
            applied_term: u64::from_le_bytes(word(bytes, 24)),
            state_hash: u64::from_le_bytes(word(bytes, 32)),
            created_at_ns: i64::from_le_bytes(word(bytes, 40)),
            state_len: u64::from_le_bytes(word(bytes, 48)),
            cluster_id: word(bytes, 56),
            release,
        };
        Ok((header, len))
    }
}

/// The whole file for `header` and `state` (`header.state_len` is set from `state`), in three
/// parts: header, state, trailer. A writer streams them in order.
pub fn encode(mut header: Header, state: &[u8]) -> (Vec<u8>, [u8; TRAILER_LEN]) {
    header.state_len = state.len() as u64;
    let head = header.encode();
    let mut hasher = Sha256::new();
    hasher.update(&head);
    hasher.update(state);
    (head, hasher.finalize().into())
}

/// A checked backup file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub header: Header,
    /// Where the state starts in the file (the header's length).
    pub state_at: usize,
    /// The file's SHA-256 (its trailer).
    pub checksum: [u8; TRAILER_LEN],
    /// The file's length in bytes.
    pub len: u64,
}

/// Checks a backup file as it arrives, without holding it: feed every byte in order to
/// [`Verifier::push`], then [`Verifier::finish`].
#[derive(Default)]
pub struct Verifier {
    hasher: Sha256,
    head: Vec<u8>,
    /// The last bytes seen (at most [`TRAILER_LEN`]): the trailer, once the stream ends.
    held: Vec<u8>,
    len: u64,
}

impl Verifier {
    pub fn new() -> Verifier {
        Verifier::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.len += bytes.len() as u64;
        let room = (HEADER_LEN + 1 + RELEASE_MAX).saturating_sub(self.head.len());
        self.head.extend_from_slice(&bytes[..room.min(bytes.len())]);
        self.held.extend_from_slice(bytes);
        if self.held.len() > TRAILER_LEN {
            let hashed = self.held.len() - TRAILER_LEN;
            self.hasher.update(&self.held[..hashed]);
            self.held.drain(..hashed);
        }
    }

    /// Compression first (a compressed file says so rather than "damaged"), then the
    /// checksum, the header and the lengths.
    pub fn finish(self) -> Result<Verified, BackupError> {
        if let Some((format, tool)) = compression(&self.head) {
            return Err(BackupError::Compressed { format, tool });
        }
        if self.len < (HEADER_LEN + TRAILER_LEN) as u64 {
            return Err(BackupError::TooShort { len: self.len });
        }
        let computed: [u8; TRAILER_LEN] = self.hasher.finalize().into();
        if self.held[..] != computed[..] {
            return Err(BackupError::Checksum {
                stored: hex(&self.held),
                computed: hex(&computed),
            });
        }
        let (header, state_at) = Header::decode(&self.head)?;
        let present = self
            .len
            .checked_sub((state_at + TRAILER_LEN) as u64)
            .ok_or(BackupError::TooShort { len: self.len })?;
        if header.state_len != present {
            return Err(BackupError::Length {
                state_len: header.state_len,
                present,
            });
        }
        Ok(Verified {
            header,
            state_at,
            checksum: computed,
            len: self.len,
        })
    }
}

/// The compression a file starting with `head` is in, by its magic number, and the tool that
/// undoes it: (gzip, gzip), (zstd, zstd), (xz, xz), (bzip2, bzip2).
fn compression(head: &[u8]) -> Option<(&'static str, &'static str)> {
    const KNOWN: [(&[u8], &str); 4] = [
        (&[0x1f, 0x8b], "gzip"),
        (&[0x28, 0xb5, 0x2f, 0xfd], "zstd"),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz"),
        (b"BZh", "bzip2"),
    ];
    KNOWN
        .iter()
        .find(|(magic, _)| head.starts_with(magic))
        .map(|(_, name)| (*name, *name))
}

/// Checks a whole backup file; returns what it says and its state bytes.
pub fn verify(bytes: &[u8]) -> Result<(Verified, &[u8]), BackupError> {
    let mut verifier = Verifier::new();
    verifier.push(bytes);
    let verified = verifier.finish()?;
    let state = &bytes[verified.state_at..bytes.len() - TRAILER_LEN];
    Ok((verified, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Header, Vec<u8>) {
        let header = Header {
            data_format: 2,
            applied_index: 1234,
            applied_term: 7,
            state_hash: 0xdead_beef,
            created_at_ns: 1_700_000_000_000_000_000,
            state_len: 0,
            cluster_id: cluster_id_bytes(&"ab".repeat(16)),
            release: "0.2.0".into(),
        };
        let state: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let (head, trailer) = encode(header.clone(), &state);
        let mut file = head.to_vec();
        file.extend_from_slice(&state);
        file.extend_from_slice(&trailer);
        (header, file)
    }

    #[test]
    fn a_compressed_file_says_so_and_how_to_undo_it() {
        let (_, file) = sample();
        for (magic, name) in [
            (&[0x1f_u8, 0x8b][..], "gzip"),
            (&[0x28, 0xb5, 0x2f, 0xfd][..], "zstd"),
            (&[0xfd, b'7', b'z', b'X', b'Z', 0x00][..], "xz"),
            (&b"BZh9"[..], "bzip2"),
        ] {
            let mut compressed = magic.to_vec();
            compressed.extend_from_slice(&file[..100]);
            let err = verify(&compressed).map(|_| ()).expect_err("compressed");
            assert_eq!(
                err,
                BackupError::Compressed {
                    format: name,
                    tool: name
                }
            );
            assert!(
                err.to_string().starts_with(&format!(
                    "this file is {name}-compressed: decompress it first"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn a_file_round_trips_whole_and_in_pieces() {
        let (header, file) = sample();
        let (verified, state) = verify(&file).expect("valid");
        assert_eq!(verified.header.applied_index, header.applied_index);
        assert_eq!(verified.header.applied_term, 7);
        assert_eq!(verified.header.state_hash, header.state_hash);
        assert_eq!(verified.header.state_len, 5000);
        assert_eq!(hex(&verified.header.cluster_id), "ab".repeat(16));
        assert_eq!(verified.header.release, "0.2.0");
        assert_eq!(verified.state_at, HEADER_LEN + 1 + "0.2.0".len());
        assert_eq!(state, &file[verified.state_at..file.len() - TRAILER_LEN]);
        for piece in [1, 7, 31, 32, 33, 72, 1000] {
            let mut verifier = Verifier::new();
            for chunk in file.chunks(piece) {
                verifier.push(chunk);
            }
            assert_eq!(
                verifier.finish().as_ref(),
                Ok(&verified),
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn every_flipped_byte_is_a_checksum_mismatch_and_truncation_is_caught() {
        let (_, file) = sample();
        for i in (0..file.len())
            .step_by(13)
            .chain([0, 8, 71, file.len() - 1])
        {
            let mut damaged = file.clone();
            damaged[i] ^= 0x20;
            let err = verify(&damaged).expect_err("damage noticed");
            assert!(
                matches!(err, BackupError::Checksum { .. }),
                "byte {i}: {err}"
            );
            assert!(err.to_string().starts_with("checksum mismatch"), "{err}");
        }
        for len in [0, 50, HEADER_LEN + TRAILER_LEN - 1, file.len() - 1] {
            assert!(verify(&file[..len]).is_err(), "truncated to {len}");
        }
    }

    #[test]
    fn other_versions_and_lying_lengths_are_refused_even_with_a_valid_checksum() {
        let (header, _) = sample();
        let rehash = |head: Vec<u8>, state: &[u8]| {
            let mut file = head.to_vec();
            file.extend_from_slice(state);
            let digest: [u8; 32] = Sha256::digest(&file).into();
            file.extend_from_slice(&digest);
            file
        };
        let mut head = Header {
            state_len: 3,
            ..header.clone()
        }
        .encode();
        head[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(
            verify(&rehash(head, b"abc")).map(|_| ()),
            Err(BackupError::Version { found: 3 })
        );
        let head = Header {
            state_len: 4,
            ..header.clone()
        }
        .encode();
        assert_eq!(
            verify(&rehash(head, b"abc")).map(|_| ()),
            Err(BackupError::Length {
                state_len: 4,
                present: 3
            })
        );
        let mut head = Header {
            state_len: 3,
            ..header
        }
        .encode();
        head[0] = b'X';
        assert_eq!(
            verify(&rehash(head, b"abc")).map(|_| ()),
            Err(BackupError::Magic)
        );
    }

    #[test]
    fn a_file_without_a_release_is_format_1_as_release_0_1_0_writes_it() {
        let (header, _) = sample();
        let header = Header {
            release: String::new(),
            ..header
        };
        let state = b"state bytes";
        let (head, trailer) = encode(header.clone(), state);
        assert_eq!(head.len(), HEADER_LEN);
        assert_eq!(u32::from_le_bytes(word(&head, 8)), 1);
        let mut file = head;
        file.extend_from_slice(state);
        file.extend_from_slice(&trailer);
        let (verified, read) = verify(&file).expect("valid");
        assert_eq!(verified.header.release, "");
        assert_eq!(verified.state_at, HEADER_LEN);
        assert_eq!(read, state);
    }
}
