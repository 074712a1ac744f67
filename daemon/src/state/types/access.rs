//! Access control's vocabulary: token hashes, permissions, and the views of roles and tokens.

use serde::{Deserialize, Serialize};

use super::*;

/// SHA-256 of a token.
pub(crate) type TokenHash = [u8; 32];

/// A permission on a namespace; each includes the ones below it: read < acquire < write <
/// admin. (Declared in the order they were added, which the encoding keeps; [`Ord`] follows
/// [`Permission::rank`].)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Permission {
    /// Get and list.
    Read,
    /// Also: create, update and delete semaphores.
    Write,
    /// Also: create, update and delete the namespace itself.
    Admin,
    /// Also (over read): leases, acquire and release, and creating a semaphore that does not
    /// exist yet; what `conch sema` and `conch elect` need, and nothing that changes what
    /// others hold.
    Acquire,
}

impl Permission {
    /// Its place in the order of inclusion.
    pub fn rank(self) -> u8 {
        match self {
            Permission::Read => 0,
            Permission::Acquire => 1,
            Permission::Write => 2,
            Permission::Admin => 3,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "read",
            Permission::Acquire => "acquire",
            Permission::Write => "write",
            Permission::Admin => "admin",
        }
    }

    pub fn parse(value: &str) -> Result<Permission, Error> {
        match value {
            "read" => Ok(Permission::Read),
            "acquire" => Ok(Permission::Acquire),
            "write" => Ok(Permission::Write),
            "admin" => Ok(Permission::Admin),
            _ => Err(Error::invalid(
                "permission must be one of read, acquire, write, admin",
            )),
        }
    }
}

impl PartialOrd for Permission {
    fn partial_cmp(&self, other: &Permission) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Permission {
    fn cmp(&self, other: &Permission) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleView {
    pub name: String,
    pub cluster_admin: bool,
    /// Namespace (or `*`) -> permission.
    pub grants: BTreeMap<String, Permission>,
    pub created_at: Nanos,
    pub updated_at: Nanos,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    pub role: String,
    pub created_at: Nanos,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthStatusView {
    pub enabled: bool,
    pub roles: u64,
    pub tokens: u64,
}
