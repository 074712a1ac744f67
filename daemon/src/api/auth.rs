//! Access control at the API: who is calling ([`Caller`]), whether they may
//! ([`Caller::allow`]), and the `ConchAuth` management service.
//!
//! Every client call (Grackle API, `ConchApi`, `ConchAdmin`, `ConchAuth`) names the access it
//! needs and is checked against this node's applied auth store before anything is read or
//! proposed; health, reflection and the peer service are not checked. A token arrives as the
//! metadata `authorization: Bearer <token>`; the store holds only its SHA-256. While access
//! control is off, nothing is checked and no token is hashed.
//!
//! Tokens are generated here, outside the state machine: 256 random bits from the operating
//! system, shown as `conch_` and 64 hex digits. Only the hash is proposed; the token itself is
//! returned once, in the create reply.

use std::sync::Arc;

use conch_proto::conch as cpb;
use conch_proto::conch::conch_auth_server::ConchAuth;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::status::ApiError;
use crate::base::error::NodeError;
use crate::node::Node;
use crate::state::auth::{Access, Permission, RoleView, TokenHash, TokenView, access_of};
use crate::state::{Cmd, Error, ErrorKind, Outcome};

pub(crate) use conch_proto::wire::AUTHORIZATION;
/// Generated tokens start with this.
pub(crate) const TOKEN_PREFIX: &str = "conch_";
use crate::support::secret::hash_token;

/// SHA-256 of the bearer token in `metadata`, if it carries one.
fn token_hash(metadata: &MetadataMap) -> Option<TokenHash> {
    metadata
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_hash)
}

/// SHA-256 of the token of an `authorization: Bearer <token>` value.
pub(crate) fn bearer_hash(value: &str) -> Option<TokenHash> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token)
        .filter(|t| !t.trim().is_empty())
        .map(hash_token)
}

/// 64 random bits (a new lease id's secret part): from the operating system, or from the
/// thread's seed under simulation (see `entropy.rs`).
pub(crate) fn random_u64() -> Result<u64, ApiError> {
    crate::sim_hooks::entropy::random_u64()
        .map_err(|e| ApiError::Internal(format!("no randomness for a lease id: {e}")))
}

/// A new random token: `conch_` and 64 hex digits (256 bits).
pub(crate) fn generate_token() -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::Internal(format!("no randomness for a token: {e}")))?;
    let mut token = String::with_capacity(TOKEN_PREFIX.len() + 64);
    token.push_str(TOKEN_PREFIX);
    for b in bytes {
        token.push_str(&format!("{b:02x}"));
    }
    Ok(token)
}

/// The token of a call, hashed.
///
/// The check here is the early one, against this node's applied auth store: it answers most
/// refusals without a trip through the log. The one that decides is made again by the state
/// machine where the write applies (the token travels with the command, see [`Caller::sign`]),
/// so a node that has not yet applied a revocation cannot let a revoked token write.
#[derive(Clone)]
pub(crate) struct Caller {
    token: Option<TokenHash>,
}

impl Caller {
    pub(crate) fn of<T>(node: &Node, request: &Request<T>) -> Caller {
        Caller::from_metadata(node, request.metadata())
    }

    /// A caller bearing `token` (none: an anonymous caller), for requests that arrive other than
    /// as a gRPC call (the status page's).
    pub(crate) fn bearing(token: Option<&str>) -> Caller {
        Caller {
            token: token
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(hash_token),
        }
    }

    /// The SHA-256 of the call's token, if it carried one.
    pub(crate) fn token(&self) -> Option<TokenHash> {
        self.token
    }

    pub(crate) fn from_metadata(_node: &Node, metadata: &MetadataMap) -> Caller {
        Caller {
            token: token_hash(metadata),
        }
    }

    /// Refuses the call unless its token grants `access` (always allowed while off), and while
    /// this node waits for the cluster's access control to be set up.
    pub(crate) fn allow(&self, node: &Node, access: Access) -> Result<(), ApiError> {
        setting_up(node)?;
        node.applied
            .read(|s| s.auth().authorize(self.token.as_ref(), access))
            .map_err(ApiError::from)
    }

    /// Refuses the call only while access control is being set up (the admin token of
    /// `--bootstrap-admin-token-file` not committed yet): for calls that need no token.
    pub(crate) fn setting_up(&self, node: &Node) -> Result<(), ApiError> {
        setting_up(node)
    }

    /// Refuses the call unless its token is known (always allowed while off).
    pub(crate) fn authenticated(&self, node: &Node) -> Result<(), ApiError> {
        setting_up(node)?;
        node.applied
            .read(|s| s.auth().authenticate(self.token.as_ref()))
            .map_err(ApiError::from)
    }

    /// Whether the call may read `ns` by the auth store of `state` (for a listing read under
    /// the state's lock).
    pub(crate) fn may_read_in(&self, state: &crate::state::State, ns: &str) -> bool {
        state
            .auth()
            .authorize(self.token.as_ref(), Access::Namespace(ns, Permission::Read))
            .is_ok()
    }

    /// Whether the call may see a lease of `ns` created by token `owner`, by the auth store of
    /// `state`: always while access control is off; else a lease created without a token, its
    /// own, or any with admin on the namespace.
    pub(crate) fn may_see_lease(
        &self,
        state: &crate::state::State,
        ns: &str,
        owner: Option<u64>,
    ) -> bool {
        let auth = state.auth();
        let Some(owner) = owner else { return true };
        !auth.enabled()
            || self.token.as_ref().and_then(|t| auth.token_id(t)) == Some(owner)
            || auth
                .authorize(
                    self.token.as_ref(),
                    Access::Namespace(ns, Permission::Admin),
                )
                .is_ok()
    }

    /// Empties `lease_id` (a holder's or waiter's) unless this call may see that lease
    /// ([`Caller::may_see_lease`]): another token's lease id is a handle on its slots, shown
    /// only with admin on the namespace.
    pub(crate) fn hide_lease_id(
        &self,
        state: &crate::state::State,
        ns: &str,
        lease_id: &mut String,
        owner: Option<u64>,
    ) {
        if !self.may_see_lease(state, ns, owner) {
            lease_id.clear();
        }
    }

    /// Refuses the write `cmd` unless this call may make it, by this node's applied state (one
    /// read): the access it needs ([`access_of`], the state's own mapping), and, for a command
    /// that uses a lease, that the lease is the caller's or the caller has admin on its
    /// namespace.
    pub(crate) fn allow_write(&self, node: &Node, cmd: &Cmd) -> Result<(), ApiError> {
        let Some(access) = access_of(cmd) else {
            return Ok(());
        };
        setting_up(node)?;
        node.applied.read(|s| {
            s.auth()
                .authorize(self.token.as_ref(), access)
                .map_err(ApiError::from)?;
            Ok(s.may_use_lease(self.token.as_ref(), cmd)?)
        })
    }

    /// `cmd` carrying this call's token, for the state machine's own check.
    pub(crate) fn sign(&self, cmd: Cmd) -> Cmd {
        cmd.with_token(self.token)
    }
}

/// Whether this node must wait for the admin token before answering: it was started with
/// `--bootstrap-admin-token-file` and its applied state has access control neither bootstrapped
/// nor on. Until the token commits, no client call is answered, so there is no moment in which
/// the cluster serves without access control.
pub(crate) fn bootstrap_pending(node: &Node) -> bool {
    node.config.bootstrap_admin_token.is_some()
        && node
            .applied
            .read(|s| !s.auth().bootstrapped() && !s.auth().enabled())
}

fn setting_up(node: &Node) -> Result<(), ApiError> {
    if bootstrap_pending(node) {
        return Err(ApiError::Node(NodeError::Unavailable(
            "access control is being set up: this node was started with \
             --bootstrap-admin-token-file and the cluster has not committed the admin token \
             yet; retry shortly"
                .into(),
        )));
    }
    Ok(())
}

/// The problem with this node's access control setup that an operator must fix, if any:
/// started with `--bootstrap-admin-token-file` while the cluster has access control off.
pub(crate) fn setup_problem(node: &Node) -> Option<String> {
    let configured = node.config.bootstrap_admin_token.is_some();
    let (bootstrapped, enabled) = node
        .applied
        .read(|s| (s.auth().bootstrapped(), s.auth().enabled()));
    (configured && bootstrapped && !enabled).then(|| {
        format!(
            "node {} was started with --bootstrap-admin-token-file but the cluster has access \
             control off (it was turned off after the bootstrap): turn it on with `conch auth \
             enable`, or start this node without the token file",
            node.id
        )
    })
}

/// A request to another node carrying the caller's token, so that node checks it too.
pub(crate) fn forward<T>(metadata: &MetadataMap, message: T) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(value) = metadata.get(AUTHORIZATION) {
        request.metadata_mut().insert(AUTHORIZATION, value.clone());
    }
    request
}

/// Sets up access control for a node started with `--bootstrap-admin-token-file`: while the
/// applied state has it neither bootstrapped nor on, proposes the admin token (through the
/// leader, wherever it is), retrying until an entry settles it; the state installs it at most
/// once, whoever proposes it. Runs on every start, so a cluster whose first node stopped before
/// the token committed finishes the bootstrap when any node with the file comes back. A cluster
/// that has access control off after its bootstrap is reported (see [`setup_problem`]).
pub(crate) async fn bootstrap(node: Arc<Node>, hash: TokenHash) {
    loop {
        // Decide on an applied state that holds every entry committed before now: a restarted
        // node applies its log only as far as it had recorded it committed until a leader
        // confirms the rest, and the entry that turned access control off may be in the rest.
        if let Err(e) = node.linearizable().await {
            tracing::debug!(error = %e, "bootstrap admin token: waiting for the log");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        }
        if !bootstrap_pending(&node) {
            match setup_problem(&node) {
                Some(problem) => tracing::error!("{problem}"),
                None => tracing::info!("access control is on"),
            }
            return;
        }
        match node.write_one(Cmd::AuthBootstrap { hash }).await {
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "bootstrap admin token refused");
                return;
            }
            Err(e) => tracing::debug!(error = %e, "bootstrap admin token: retrying"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

pub(crate) struct AuthService {
    node: Arc<Node>,
}

impl AuthService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        AuthService { node }
    }

    fn admin<T>(&self, request: &Request<T>) -> Result<Caller, ApiError> {
        let caller = Caller::of(&self.node, request);
        caller.allow(&self.node, Access::ClusterAdmin)?;
        Ok(caller)
    }

    async fn write(&self, caller: &Caller, cmd: Cmd) -> Result<Outcome, ApiError> {
        let cmd = caller.sign(cmd);
        cmd.validate()?;
        Ok(self.node.write_one(cmd).await??)
    }

    async fn read<T>(
        &self,
        read: impl FnOnce(&crate::state::auth::Auth) -> Result<T, Error>,
    ) -> Result<T, ApiError> {
        self.node.linearizable().await?;
        Ok(self.node.applied.read(|s| read(s.auth()))?)
    }

    fn status(&self, outcome: Outcome) -> Result<Response<cpb::AuthStatusResponse>, Status> {
        match outcome {
            Outcome::AuthStatus(s) => Ok(Response::new(cpb::AuthStatusResponse {
                enabled: s.enabled,
                roles: s.roles,
                tokens: s.tokens,
                problems: setup_problem(&self.node).into_iter().collect(),
            })),
            other => Err(unexpected(other)),
        }
    }

    fn role(&self, outcome: Outcome) -> Result<Response<cpb::RoleResponse>, Status> {
        match outcome {
            Outcome::Role(role) => Ok(Response::new(cpb::RoleResponse {
                role: Some(role_message(role)),
            })),
            other => Err(unexpected(other)),
        }
    }
}

fn unexpected(outcome: Outcome) -> Status {
    ApiError::Internal(format!("unexpected state machine reply: {outcome:?}")).into()
}

fn role_message(role: RoleView) -> cpb::Role {
    cpb::Role {
        name: role.name,
        cluster_admin: role.cluster_admin,
        grants: role
            .grants
            .into_iter()
            .map(|(namespace, perm)| cpb::Grant {
                namespace,
                permission: perm.as_str().to_string(),
            })
            .collect(),
        created_at: role.created_at,
        updated_at: role.updated_at,
    }
}

fn token_message(token: TokenView) -> cpb::Token {
    cpb::Token {
        id: token.id,
        name: token.name,
        role: token.role,
        created_at: token.created_at,
    }
}

#[tonic::async_trait]
impl ConchAuth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<cpb::AuthEnableRequest>,
    ) -> Result<Response<cpb::AuthStatusResponse>, Status> {
        let caller = self.admin(&request)?;
        if !self.node.config.peers_authenticate() {
            return Err(ApiError::State(Error {
                kind: ErrorKind::FailedPrecondition,
                message: format!(
                    "access control cannot be turned on while node {} has no peer \
                     authentication: anyone who reaches its peer service could change the state \
                     unchecked; start every node with --peer-secret-file or --peer-ca first",
                    self.node.id
                ),
            })
            .into());
        }
        let outcome = self.write(&caller, Cmd::AuthEnable).await?;
        self.status(outcome)
    }

    async fn auth_disable(
        &self,
        request: Request<cpb::AuthDisableRequest>,
    ) -> Result<Response<cpb::AuthStatusResponse>, Status> {
        let caller = self.admin(&request)?;
        let outcome = self.write(&caller, Cmd::AuthDisable).await?;
        self.status(outcome)
    }

    async fn auth_status(
        &self,
        request: Request<cpb::AuthStatusRequest>,
    ) -> Result<Response<cpb::AuthStatusResponse>, Status> {
        self.admin(&request)?;
        let status = self.read(|auth| Ok(auth.status())).await?;
        self.status(Outcome::AuthStatus(status))
    }

    async fn role_create(
        &self,
        request: Request<cpb::RoleCreateRequest>,
    ) -> Result<Response<cpb::RoleResponse>, Status> {
        let caller = self.admin(&request)?;
        let r = request.into_inner();
        let cmd = Cmd::RoleCreate {
            name: r.name,
            cluster_admin: r.cluster_admin,
        };
        let outcome = self.write(&caller, cmd).await?;
        self.role(outcome)
    }

    async fn role_grant(
        &self,
        request: Request<cpb::RoleGrantRequest>,
    ) -> Result<Response<cpb::RoleResponse>, Status> {
        let caller = self.admin(&request)?;
        let r = request.into_inner();
        let perm = Permission::parse(&r.permission).map_err(ApiError::from)?;
        let cmd = Cmd::RoleGrant {
            role: r.role,
            ns: r.namespace,
            perm,
        };
        let outcome = self.write(&caller, cmd).await?;
        self.role(outcome)
    }

    async fn role_revoke(
        &self,
        request: Request<cpb::RoleRevokeRequest>,
    ) -> Result<Response<cpb::RoleResponse>, Status> {
        let caller = self.admin(&request)?;
        let r = request.into_inner();
        let cmd = Cmd::RoleRevoke {
            role: r.role,
            ns: r.namespace,
        };
        let outcome = self.write(&caller, cmd).await?;
        self.role(outcome)
    }

    async fn role_get(
        &self,
        request: Request<cpb::RoleGetRequest>,
    ) -> Result<Response<cpb::RoleResponse>, Status> {
        self.admin(&request)?;
        let name = request.into_inner().name;
        let role = self.read(|auth| auth.get_role(&name)).await?;
        self.role(Outcome::Role(role))
    }

    async fn role_list(
        &self,
        request: Request<cpb::RoleListRequest>,
    ) -> Result<Response<cpb::RoleListResponse>, Status> {
        self.admin(&request)?;
        let roles = self.read(|auth| Ok(auth.roles())).await?;
        Ok(Response::new(cpb::RoleListResponse {
            roles: roles.into_iter().map(role_message).collect(),
        }))
    }

    async fn role_delete(
        &self,
        request: Request<cpb::RoleDeleteRequest>,
    ) -> Result<Response<cpb::RoleDeleteResponse>, Status> {
        let caller = self.admin(&request)?;
        let name = request.into_inner().name;
        self.write(&caller, Cmd::RoleDelete { name }).await?;
        Ok(Response::new(cpb::RoleDeleteResponse {}))
    }

    async fn token_create(
        &self,
        request: Request<cpb::TokenCreateRequest>,
    ) -> Result<Response<cpb::TokenCreateResponse>, Status> {
        let caller = self.admin(&request)?;
        let r = request.into_inner();
        let secret = generate_token()?;
        let cmd = Cmd::TokenCreate {
            name: r.name,
            role: r.role,
            hash: hash_token(&secret),
        };
        match self.write(&caller, cmd).await? {
            Outcome::Token(token) => Ok(Response::new(cpb::TokenCreateResponse {
                token: Some(token_message(token)),
                secret,
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn token_revoke(
        &self,
        request: Request<cpb::TokenRevokeRequest>,
    ) -> Result<Response<cpb::TokenRevokeResponse>, Status> {
        let caller = self.admin(&request)?;
        let id = request.into_inner().id;
        self.write(&caller, Cmd::TokenRevoke { id }).await?;
        Ok(Response::new(cpb::TokenRevokeResponse {}))
    }

    async fn token_list(
        &self,
        request: Request<cpb::TokenListRequest>,
    ) -> Result<Response<cpb::TokenListResponse>, Status> {
        self.admin(&request)?;
        let tokens = self.read(|auth| Ok(auth.tokens())).await?;
        Ok(Response::new(cpb::TokenListResponse {
            tokens: tokens.into_iter().map(token_message).collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::secret::TOKEN_MIN_CHARS;

    #[test]
    fn generated_tokens_are_long_random_and_hash_trimmed() {
        let a = generate_token().expect("token");
        let b = generate_token().expect("token");
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 64);
        assert!(a.len() >= TOKEN_MIN_CHARS);
        assert_eq!(hash_token(&a), hash_token(&format!(" {a}\n")));
        assert_ne!(hash_token(&a), hash_token(&b));
    }
}
