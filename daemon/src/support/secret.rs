//! Tokens and secrets as stored: the SHA-256 of what is presented, surrounding whitespace
//! removed. A leaf, shared by the configuration (the peer secret and bootstrap token files) and
//! access control.

use sha2::{Digest, Sha256};

use crate::state::auth::TokenHash;

/// A token (generated or from the bootstrap file) has at least this many characters.
pub(crate) const TOKEN_MIN_CHARS: usize = 32;

/// SHA-256 of a token as presented (surrounding whitespace removed).
pub(crate) fn hash_token(token: &str) -> TokenHash {
    Sha256::digest(token.trim().as_bytes()).into()
}
