//! Access control: the replicated auth store and its commands.
//!
//! The store is part of the canonical data (snapshots carry it, the state hash covers it):
//! - `enabled`: whether the API checks tokens at all (off by default);
//! - `bootstrapped`: whether the bootstrap admin token was installed (it is, at most once);
//! - roles by name: a cluster-wide `cluster_admin` flag and per-namespace grants (`*` = every
//!   namespace) of one [`Permission`] each, `read` < `write` < `admin`, each including the ones
//!   below it;
//! - tokens by id (`tk_<n>`, from a counter): a name, a role and the SHA-256 of the token. The
//!   token itself is never stored: the node that receives a create generates it outside the
//!   state machine, proposes only its hash and returns it once.
//!
//! Derived, rebuilt on decode and checked by the invariants: the index from token hash to id.
//!
//! What always holds here: every token names an existing role (a role in use cannot be
//! deleted); while access control is enabled at least one token has a `cluster_admin` role (so
//! `AuthEnable` is refused without one, and revoking the last one is refused while enabled);
//! token hashes are unique; a refused command changes nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::types::*;
use super::validate;

// The access control vocabulary lives with the other commands and views.
pub(crate) use super::types::{AuthStatusView, Permission, RoleView, TokenHash, TokenView};

/// The namespace key of a grant that applies to every namespace.
pub(crate) const ALL_NAMESPACES: &str = "*";
/// The namespace `conch sema` keeps its semaphores in: creating it needs only `write` on it, so
/// `write` on it is all the CLI needs.
pub(crate) const CLI_NAMESPACE: &str = "conch";
/// The role the bootstrap admin token gets.
pub(crate) const BOOTSTRAP_ROLE: &str = "cluster-admin";
/// The name of the bootstrap admin token.
pub(crate) const BOOTSTRAP_TOKEN_NAME: &str = "bootstrap-admin";
/// At most this many roles and this many tokens.
pub(crate) const ROLES_MAX: usize = 1_000;
pub(crate) const TOKENS_MAX: usize = 10_000;
/// At most this many grants per role.
pub(crate) const GRANTS_PER_ROLE_MAX: usize = 1_000;

/// The auth store. Its fields are private: the hash index is kept by the methods below.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Auth {
    enabled: bool,
    bootstrapped: bool,
    last_token_id: u64,
    roles: BTreeMap<String, Role>,
    tokens: BTreeMap<u64, Token>,
    /// Derived: token hash -> token id.
    #[serde(skip)]
    by_hash: BTreeMap<TokenHash, u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Role {
    cluster_admin: bool,
    grants: BTreeMap<String, Permission>,
    created_at: Nanos,
    updated_at: Nanos,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Token {
    name: String,
    role: String,
    hash: TokenHash,
    created_at: Nanos,
}

/// What a call needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access<'a> {
    Namespace(&'a str, Permission),
    ClusterAdmin,
}

/// Why a call is refused by access control.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No token, or one the store does not know (never issued, or revoked).
    Unauthenticated(String),
    /// A known token whose role lacks the permission.
    PermissionDenied(String),
}

impl From<Denied> for Error {
    fn from(denied: Denied) -> Error {
        match denied {
            Denied::Unauthenticated(message) => Error {
                kind: ErrorKind::Unauthenticated,
                message,
            },
            Denied::PermissionDenied(message) => Error {
                kind: ErrorKind::PermissionDenied,
                message,
            },
        }
    }
}

/// What a client command needs of its caller's token while access control is on (the same as
/// the API checks before proposing it); `None` for the commands nodes propose themselves:
/// expiry, lease extension, giving up a wait, the bootstrap.
pub(crate) fn access_of(cmd: &Cmd) -> Option<Access<'_>> {
    use Permission::{Acquire, Admin, Write};
    Some(match cmd {
        // The CLI's own namespace may be created by whoever may acquire in it.
        Cmd::CreateNamespace { name, .. } if name == CLI_NAMESPACE => {
            Access::Namespace(name, Acquire)
        }
        Cmd::CreateNamespace { name, .. }
        | Cmd::UpdateNamespace { name, .. }
        | Cmd::DeleteNamespace { name } => Access::Namespace(name, Admin),
        // Taking another's slot: what a namespace's administrator may do.
        Cmd::RevokeHolder { ns, .. } => Access::Namespace(ns, Admin),
        // Creating a semaphore that exists already is refused, so it changes nothing of
        // others'; changing or deleting one does.
        Cmd::CreateSemaphore { ns, .. }
        | Cmd::CreateLease { ns, .. }
        | Cmd::RefreshLease { ns, .. }
        | Cmd::RevokeLease { ns, .. }
        | Cmd::Acquire { ns, .. }
        | Cmd::Release { ns, .. }
        | Cmd::AcquireLock { ns, .. }
        | Cmd::ReleaseLock { ns, .. }
        | Cmd::AcquireSet { ns, .. } => Access::Namespace(ns, Acquire),
        // Deleting a lock drops other leases' holds.
        Cmd::UpdateSemaphore { ns, .. }
        | Cmd::DeleteSemaphore { ns, .. }
        | Cmd::DeleteLock { ns, .. } => Access::Namespace(ns, Write),
        // Wait groups and barriers: every write needs write, as semaphore changes do.
        Cmd::WaitGroup(cmd) => Access::Namespace(cmd.ns(), Write),
        Cmd::Barrier(cmd) => Access::Namespace(cmd.ns(), Write),
        Cmd::AuthEnable
        | Cmd::AuthDisable
        | Cmd::RoleCreate { .. }
        | Cmd::RoleGrant { .. }
        | Cmd::RoleRevoke { .. }
        | Cmd::RoleDelete { .. }
        | Cmd::TokenCreate { .. }
        | Cmd::TokenRevoke { .. }
        | Cmd::SetQuotas { .. }
        | Cmd::SetBudget { .. } => Access::ClusterAdmin,
        // Raising the cluster version is a node's decision (after checking every member's
        // release), taken for a cluster admin's `FinalizeUpgrade` or at bootstrap.
        Cmd::GiveUp { .. }
        | Cmd::Expire
        | Cmd::ExtendLeases
        | Cmd::AuthBootstrap { .. }
        | Cmd::SetClusterVersion { .. } => {
            return None;
        }
        Cmd::Once { cmd, .. } | Cmd::As { cmd, .. } => return access_of(cmd),
    })
}

pub(crate) fn token_id(id: u64) -> String {
    format!("tk_{id}")
}

fn parse_token_id(id: &str) -> Option<u64> {
    id.strip_prefix("tk_")?
        .parse()
        .ok()
        .filter(|n: &u64| *n > 0 && token_id(*n) == id)
}

fn failed_precondition(message: impl Into<String>) -> Error {
    Error {
        kind: ErrorKind::FailedPrecondition,
        message: message.into(),
    }
}

fn role_not_found(name: &str) -> Error {
    Error::not_found(format!("role {name} not found"))
}

/// A grant's namespace: a namespace name or `*`.
pub(crate) fn grant_namespace(value: &str) -> Result<(), Error> {
    if value == ALL_NAMESPACES {
        Ok(())
    } else {
        validate::name("namespace_name", value)
    }
}

impl Auth {
    /// Never used: off, never bootstrapped, no role, no token ever created.
    pub fn is_empty(&self) -> bool {
        !self.enabled
            && !self.bootstrapped
            && self.last_token_id == 0
            && self.roles.is_empty()
            && self.tokens.is_empty()
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn bootstrapped(&self) -> bool {
        self.bootstrapped
    }

    pub fn status(&self) -> AuthStatusView {
        AuthStatusView {
            enabled: self.enabled,
            roles: self.roles.len() as u64,
            tokens: self.tokens.len() as u64,
        }
    }

    fn role_view(&self, name: &str) -> Option<RoleView> {
        self.roles.get(name).map(|r| RoleView {
            name: name.to_string(),
            cluster_admin: r.cluster_admin,
            grants: r.grants.clone(),
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }

    pub fn get_role(&self, name: &str) -> Result<RoleView, Error> {
        self.role_view(name).ok_or_else(|| role_not_found(name))
    }

    pub fn roles(&self) -> Vec<RoleView> {
        self.roles
            .keys()
            .filter_map(|name| self.role_view(name))
            .collect()
    }

    pub fn tokens(&self) -> Vec<TokenView> {
        self.tokens
            .iter()
            .map(|(id, t)| token_view(*id, t))
            .collect()
    }

    /// The id of the token with this hash, if the store knows it.
    pub fn token_id(&self, hash: &TokenHash) -> Option<u64> {
        self.by_hash.get(hash).copied()
    }

    /// Who token `id` is, for the audit trail: its name and role now, or anonymous.
    pub fn actor(&self, id: Option<u64>) -> super::audit_types::Actor {
        match id.and_then(|id| self.tokens.get(&id).map(|t| (id, t))) {
            Some((id, t)) => super::audit_types::Actor {
                name: t.name.clone(),
                role: t.role.clone(),
                token: Some(id),
            },
            None => super::audit_types::Actor {
                name: super::audit_types::ANONYMOUS.to_string(),
                role: String::new(),
                token: None,
            },
        }
    }

    /// Whether the caller (`token`, whose id is `caller`) may use lease `lease` of namespace
    /// `ns`, created by token `owner`: always while access control is off; else only the owner,
    /// or a token with admin on the namespace.
    pub fn may_use_lease(
        &self,
        token: Option<&TokenHash>,
        caller: Option<u64>,
        ns: &str,
        lease: &str,
        owner: u64,
    ) -> Result<(), Error> {
        if !self.enabled || caller == Some(owner) {
            return Ok(());
        }
        if self
            .authorize(token, Access::Namespace(ns, Permission::Admin))
            .is_ok()
        {
            return Ok(());
        }
        Err(Error {
            kind: ErrorKind::PermissionDenied,
            message: format!(
                "lease {lease} belongs to another token: only it, or a token with admin on \
                 namespace {ns}, may use it"
            ),
        })
    }

    /// Whether a token with a `cluster_admin` role exists.
    fn has_admin_token(&self) -> bool {
        self.tokens
            .values()
            .any(|t| self.roles.get(&t.role).is_some_and(|r| r.cluster_admin))
    }

    /// Checks a call against the store: always allowed while disabled.
    pub fn authorize(&self, token: Option<&TokenHash>, access: Access) -> Result<(), Denied> {
        if !self.enabled {
            return Ok(());
        }
        let Some(hash) = token else {
            return Err(Denied::Unauthenticated(
                "access control is on: send the metadata \"authorization: Bearer <token>\"".into(),
            ));
        };
        let Some((id, token)) = self
            .by_hash
            .get(hash)
            .and_then(|id| self.tokens.get(id).map(|t| (*id, t)))
        else {
            return Err(Denied::Unauthenticated("unknown or revoked token".into()));
        };
        let role = self.roles.get(&token.role);
        if role.is_some_and(|r| r.cluster_admin) {
            return Ok(());
        }
        let who = format!(
            "token {} ({}, role {})",
            token_id(id),
            token.name,
            token.role
        );
        match access {
            Access::ClusterAdmin => Err(Denied::PermissionDenied(format!(
                "{who} lacks cluster-admin"
            ))),
            Access::Namespace(ns, need) => {
                let has = role.and_then(|r| {
                    let named = r.grants.get(ns).copied();
                    let all = r.grants.get(ALL_NAMESPACES).copied();
                    named.max(all)
                });
                if has.is_some_and(|p| p >= need) {
                    Ok(())
                } else {
                    Err(Denied::PermissionDenied(format!(
                        "{who} lacks {} permission on namespace {ns}",
                        need.as_str()
                    )))
                }
            }
        }
    }

    /// Checks only that the token is known (always allowed while disabled).
    pub fn authenticate(&self, token: Option<&TokenHash>) -> Result<(), Denied> {
        match self.authorize(token, Access::ClusterAdmin) {
            Err(Denied::PermissionDenied(_)) => Ok(()),
            other => other,
        }
    }

    /// Applies an auth command. `None` when `cmd` is not one.
    /// `wall_ns`: the batch's wall-clock stamp, for the times users read.
    pub(super) fn apply(&mut self, cmd: &Cmd, clock_ns: Nanos) -> Option<Reply> {
        let reply = match cmd {
            Cmd::AuthEnable => {
                if !self.has_admin_token() {
                    return Some(Err(failed_precondition(
                        "access control needs a token with a cluster-admin role first \
                         (create a role with cluster-admin and a token for it)",
                    )));
                }
                self.enabled = true;
                Ok(Outcome::AuthStatus(self.status()))
            }
            Cmd::AuthDisable => {
                self.enabled = false;
                Ok(Outcome::AuthStatus(self.status()))
            }
            Cmd::RoleCreate {
                name,
                cluster_admin,
            } => self.role_create(name, *cluster_admin, clock_ns),
            Cmd::RoleGrant { role, ns, perm } => self.role_grant(role, ns, Some(*perm), clock_ns),
            Cmd::RoleRevoke { role, ns } => self.role_grant(role, ns, None, clock_ns),
            Cmd::RoleDelete { name } => self.role_delete(name),
            Cmd::TokenCreate { name, role, hash } => self.token_create(name, role, hash, clock_ns),
            Cmd::TokenRevoke { id } => self.token_revoke(id),
            Cmd::AuthBootstrap { hash } => self.bootstrap(hash, clock_ns),
            _ => return None,
        };
        Some(reply)
    }

    fn role_create(&mut self, name: &str, cluster_admin: bool, clock_ns: Nanos) -> Reply {
        if self.roles.contains_key(name) {
            return Err(Error::already_exists(format!("role {name} already exists")));
        }
        if self.roles.len() >= ROLES_MAX {
            return Err(Error::exhausted(format!(
                "role quota reached: at most {ROLES_MAX} roles"
            )));
        }
        let role = Role {
            cluster_admin,
            grants: BTreeMap::new(),
            created_at: clock_ns,
            updated_at: clock_ns,
        };
        self.roles.insert(name.to_string(), role);
        self.get_role(name).map(Outcome::Role)
    }

    /// Sets (`Some`) or removes (`None`) a role's permission on a namespace.
    fn role_grant(
        &mut self,
        name: &str,
        ns: &str,
        perm: Option<Permission>,
        clock_ns: Nanos,
    ) -> Reply {
        let role = self
            .roles
            .get_mut(name)
            .ok_or_else(|| role_not_found(name))?;
        match perm {
            Some(perm) => {
                if !role.grants.contains_key(ns) && role.grants.len() >= GRANTS_PER_ROLE_MAX {
                    return Err(Error::exhausted(format!(
                        "grant quota reached: at most {GRANTS_PER_ROLE_MAX} namespaces per role"
                    )));
                }
                role.grants.insert(ns.to_string(), perm);
            }
            None => {
                role.grants.remove(ns);
            }
        }
        role.updated_at = clock_ns;
        self.get_role(name).map(Outcome::Role)
    }

    fn role_delete(&mut self, name: &str) -> Reply {
        if !self.roles.contains_key(name) {
            return Err(role_not_found(name));
        }
        if let Some((id, _)) = self.tokens.iter().find(|(_, t)| t.role == name) {
            return Err(failed_precondition(format!(
                "role {name} is used by token {}; revoke its tokens first",
                token_id(*id)
            )));
        }
        self.roles.remove(name);
        Ok(Outcome::Done)
    }

    fn token_create(&mut self, name: &str, role: &str, hash: &TokenHash, clock_ns: Nanos) -> Reply {
        if !self.roles.contains_key(role) {
            return Err(role_not_found(role));
        }
        if self.by_hash.contains_key(hash) {
            return Err(Error::already_exists(
                "a token with this hash already exists",
            ));
        }
        if self.tokens.len() >= TOKENS_MAX {
            return Err(Error::exhausted(format!(
                "token quota reached: at most {TOKENS_MAX} tokens"
            )));
        }
        let Some(id) = self.last_token_id.checked_add(1) else {
            return Err(Error::exhausted("token ids exhausted"));
        };
        self.last_token_id = id;
        let token = Token {
            name: name.to_string(),
            role: role.to_string(),
            hash: *hash,
            created_at: clock_ns,
        };
        let view = token_view(id, &token);
        self.by_hash.insert(*hash, id);
        self.tokens.insert(id, token);
        Ok(Outcome::Token(view))
    }

    fn token_revoke(&mut self, id: &str) -> Reply {
        let not_found = || Error::not_found(format!("token {id} not found"));
        let seq = parse_token_id(id).ok_or_else(not_found)?;
        let token = self.tokens.get(&seq).ok_or_else(not_found)?;
        if self.enabled {
            let admin = |t: &Token| self.roles.get(&t.role).is_some_and(|r| r.cluster_admin);
            let other_admin = self
                .tokens
                .iter()
                .any(|(other, t)| *other != seq && admin(t));
            if admin(token) && !other_admin {
                return Err(failed_precondition(format!(
                    "token {id} is the last cluster-admin token; create another or disable \
                     access control first"
                )));
            }
        }
        if let Some(token) = self.tokens.remove(&seq) {
            self.by_hash.remove(&token.hash);
        }
        Ok(Outcome::Done)
    }

    /// Installs the bootstrap admin token and turns access control on, once.
    fn bootstrap(&mut self, hash: &TokenHash, clock_ns: Nanos) -> Reply {
        if self.bootstrapped {
            return Ok(Outcome::AuthStatus(self.status()));
        }
        // Every check first, so a refusal changes nothing.
        let create_role = match self.roles.get(BOOTSTRAP_ROLE) {
            Some(role) if !role.cluster_admin => {
                return Err(failed_precondition(format!(
                    "role {BOOTSTRAP_ROLE} exists without cluster-admin"
                )));
            }
            Some(_) => false,
            None if self.roles.len() >= ROLES_MAX => {
                return Err(Error::exhausted("role quota reached"));
            }
            None => true,
        };
        // A token with this hash already (a retried bootstrap, or one created while access
        // control was off) must be a cluster admin's: turning access control on with no
        // cluster-admin token would lock everyone out for good.
        if let Some(token) = self.by_hash.get(hash).and_then(|id| self.tokens.get(id))
            && !self.roles.get(&token.role).is_some_and(|r| r.cluster_admin)
        {
            return Err(failed_precondition(format!(
                "the bootstrap admin token is already token {} of role {}, which is not \
                 cluster-admin; revoke it (access control is off) and start again",
                token.name, token.role
            )));
        }
        let create_token = !self.by_hash.contains_key(hash);
        if create_token
            && (self.tokens.len() >= TOKENS_MAX || self.last_token_id.checked_add(1).is_none())
        {
            return Err(Error::exhausted("token quota reached"));
        }
        if create_role {
            self.role_create(BOOTSTRAP_ROLE, true, clock_ns)?;
        }
        if create_token {
            self.token_create(BOOTSTRAP_TOKEN_NAME, BOOTSTRAP_ROLE, hash, clock_ns)?;
        }
        self.bootstrapped = true;
        self.enabled = true;
        Ok(Outcome::AuthStatus(self.status()))
    }

    /// Fills the derived index from the data (after decode).
    pub(super) fn rebuild(&mut self) -> Result<(), String> {
        self.by_hash.clear();
        for (id, token) in &self.tokens {
            if self.by_hash.insert(token.hash, *id).is_some() {
                return Err(format!("token {} reuses a hash", token_id(*id)));
            }
        }
        Ok(())
    }

    /// Every rule in the module docs, from the data alone.
    /// (Timestamps are wall-clock display times, which may go back: nothing orders them.)
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        let mut by_hash = BTreeMap::new();
        for (name, role) in &self.roles {
            let at = |what: &str| format!("role {name}: {what}");
            validate::name("role", name).map_err(|e| at(&e.message))?;
            if role.grants.len() > GRANTS_PER_ROLE_MAX {
                return Err(at("over the grant quota"));
            }
            for ns in role.grants.keys() {
                grant_namespace(ns).map_err(|e| at(&e.message))?;
            }
        }
        for (id, token) in &self.tokens {
            let at = |what: &str| format!("token {}: {what}", token_id(*id));
            if *id == 0 || *id > self.last_token_id {
                return Err(at("id not from the counter"));
            }
            if !self.roles.contains_key(&token.role) {
                return Err(at(&format!("names the missing role {}", token.role)));
            }
            validate::name("name", &token.name).map_err(|e| at(&e.message))?;
            if by_hash.insert(token.hash, *id).is_some() {
                return Err(at("reuses a hash"));
            }
        }
        if self.roles.len() > ROLES_MAX || self.tokens.len() > TOKENS_MAX {
            return Err("over the role or token quota".into());
        }
        if by_hash != self.by_hash {
            return Err("token hash index does not match the tokens".into());
        }
        if self.enabled && !self.has_admin_token() {
            return Err("access control is on without a cluster-admin token".into());
        }
        Ok(())
    }
}

fn token_view(id: u64, token: &Token) -> TokenView {
    TokenView {
        id: token_id(id),
        name: token.name.clone(),
        role: token.role.clone(),
        created_at: token.created_at,
    }
}

/// Static checks of the auth commands (names, namespaces); `None` when `cmd` is not one.
pub(super) fn validate(cmd: &Cmd) -> Option<Result<(), Error>> {
    let result = match cmd {
        Cmd::AuthEnable | Cmd::AuthDisable | Cmd::AuthBootstrap { .. } => Ok(()),
        Cmd::RoleCreate { name, .. } | Cmd::RoleDelete { name } => validate::name("role", name),
        Cmd::RoleGrant { role, ns, .. } | Cmd::RoleRevoke { role, ns } => {
            validate::name("role", role).and_then(|()| grant_namespace(ns))
        }
        Cmd::TokenCreate { name, role, .. } => {
            validate::name("name", name).and_then(|()| validate::name("role", role))
        }
        Cmd::TokenRevoke { id } => {
            if id.is_empty() || id.len() > 32 {
                Err(Error::invalid("id must be a token id such as tk_1"))
            } else {
                Ok(())
            }
        }
        _ => return None,
    };
    Some(result)
}
