//! `conch auth …`: access control management (turn it on and off, roles, tokens).
//!
//! Every command needs a cluster-admin token while access control is on. `token create`
//! prints the new token alone on stdout (so it can go straight into a file) and what it is on
//! stderr; the token is never shown again.

use std::process::ExitCode;

use conch_client::proto::conch::conch_auth_client::ConchAuthClient;
use conch_client::proto::conch::{
    AuthDisableRequest, AuthEnableRequest, AuthStatusRequest, AuthStatusResponse, Role,
    RoleCreateRequest, RoleDeleteRequest, RoleGrantRequest, RoleListRequest, RoleRevokeRequest,
    Token, TokenCreateRequest, TokenListRequest, TokenRevokeRequest,
};
use conch_client::{Client, request};
use serde::Serialize;

use crate::cli::{AuthCommand, RoleCommand, TokenCommand};
use crate::timefmt;

pub async fn run(client: &Client, command: AuthCommand) -> anyhow::Result<ExitCode> {
    let opts = client.default_options();
    match command {
        AuthCommand::Enable => {
            let r = client
                .call("enable access control", opts, |ch, t| async move {
                    ConchAuthClient::new(ch)
                        .auth_enable(request(AuthEnableRequest {}, t))
                        .await
                })
                .await?;
            print_status(&r, false)
        }
        AuthCommand::Disable => {
            let r = client
                .call("disable access control", opts, |ch, t| async move {
                    ConchAuthClient::new(ch)
                        .auth_disable(request(AuthDisableRequest {}, t))
                        .await
                })
                .await?;
            print_status(&r, false)
        }
        AuthCommand::Status { json } => {
            let r = client
                .call("access control status", opts, |ch, t| async move {
                    ConchAuthClient::new(ch)
                        .auth_status(request(AuthStatusRequest {}, t))
                        .await
                })
                .await?;
            print_status(&r, json)
        }
        AuthCommand::Role { command } => role(client, command).await,
        AuthCommand::Token { command } => token(client, command).await,
    }
}

async fn role(client: &Client, command: RoleCommand) -> anyhow::Result<ExitCode> {
    let opts = client.default_options();
    let role = match command {
        RoleCommand::Create {
            name,
            cluster_admin,
        } => {
            client
                .call("create role", opts, |ch, t| {
                    let req = RoleCreateRequest {
                        name: name.clone(),
                        cluster_admin,
                    };
                    async move { ConchAuthClient::new(ch).role_create(request(req, t)).await }
                })
                .await?
                .role
        }
        RoleCommand::Grant {
            role,
            namespace,
            permission,
        } => {
            client
                .call("grant permission", opts, |ch, t| {
                    let req = RoleGrantRequest {
                        role: role.clone(),
                        namespace: namespace.clone(),
                        permission: permission.clone(),
                    };
                    async move { ConchAuthClient::new(ch).role_grant(request(req, t)).await }
                })
                .await?
                .role
        }
        RoleCommand::Revoke { role, namespace } => {
            client
                .call("revoke permission", opts, |ch, t| {
                    let req = RoleRevokeRequest {
                        role: role.clone(),
                        namespace: namespace.clone(),
                    };
                    async move { ConchAuthClient::new(ch).role_revoke(request(req, t)).await }
                })
                .await?
                .role
        }
        RoleCommand::Delete { name } => {
            client
                .call("delete role", opts, |ch, t| {
                    let req = RoleDeleteRequest { name: name.clone() };
                    async move { ConchAuthClient::new(ch).role_delete(request(req, t)).await }
                })
                .await?;
            crate::print_lines([format!("role {name} deleted")])?;
            return Ok(ExitCode::SUCCESS);
        }
        RoleCommand::List { json } => {
            let roles = client
                .call("list roles", opts, |ch, t| async move {
                    ConchAuthClient::new(ch)
                        .role_list(request(RoleListRequest {}, t))
                        .await
                })
                .await?
                .roles;
            if json {
                let roles: Vec<RoleJson> = roles.iter().map(RoleJson::from).collect();
                crate::print_lines([serde_json::to_string_pretty(&roles)?])?;
            } else {
                crate::print_lines(roles.iter().map(role_line))?;
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    if let Some(role) = role {
        crate::print_lines([role_line(&role)])?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn token(client: &Client, command: TokenCommand) -> anyhow::Result<ExitCode> {
    let opts = client.default_options();
    match command {
        TokenCommand::Create { name, role } => {
            let r = client
                .call("create token", opts, |ch, t| {
                    let req = TokenCreateRequest {
                        name: name.clone(),
                        role: role.clone(),
                    };
                    async move { ConchAuthClient::new(ch).token_create(request(req, t)).await }
                })
                .await?;
            if let Some(token) = &r.token {
                eprintln!(
                    "conch: token {} ({}, role {}) created; it is shown only this once",
                    token.id, token.name, token.role
                );
            }
            crate::print_lines([r.secret])?;
        }
        TokenCommand::Revoke { id } => {
            client
                .call("revoke token", opts, |ch, t| {
                    let req = TokenRevokeRequest { id: id.clone() };
                    async move { ConchAuthClient::new(ch).token_revoke(request(req, t)).await }
                })
                .await?;
            crate::print_lines([format!("token {id} revoked")])?;
        }
        TokenCommand::List { json } => {
            let tokens = client
                .call("list tokens", opts, |ch, t| async move {
                    ConchAuthClient::new(ch)
                        .token_list(request(TokenListRequest {}, t))
                        .await
                })
                .await?
                .tokens;
            if json {
                let tokens: Vec<TokenJson> = tokens.iter().map(TokenJson::from).collect();
                crate::print_lines([serde_json::to_string_pretty(&tokens)?])?;
            } else {
                crate::print_lines(tokens.iter().map(|t| {
                    format!(
                        "{}  {}  role={}  created={}",
                        t.id,
                        t.name,
                        t.role,
                        timefmt::format_unix_nanos(t.created_at).unwrap_or_default()
                    )
                }))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_status(r: &AuthStatusResponse, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        let value = serde_json::json!({
            "enabled": r.enabled,
            "roles": r.roles,
            "tokens": r.tokens,
            "problems": r.problems,
        });
        crate::print_lines([serde_json::to_string_pretty(&value)?])?;
    } else {
        let state = if r.enabled { "on" } else { "off" };
        let mut lines = vec![format!(
            "access control is {state} ({} roles, {} tokens)",
            r.roles, r.tokens
        )];
        lines.extend(r.problems.iter().map(|p| format!("problem: {p}")));
        crate::print_lines(lines)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn role_line(role: &Role) -> String {
    let mut line = role.name.clone();
    if role.cluster_admin {
        line.push_str("  cluster-admin");
    }
    for grant in &role.grants {
        line.push_str(&format!("  {}={}", grant.namespace, grant.permission));
    }
    line
}

#[derive(Serialize)]
struct RoleJson {
    name: String,
    cluster_admin: bool,
    grants: std::collections::BTreeMap<String, String>,
}

impl From<&Role> for RoleJson {
    fn from(role: &Role) -> Self {
        RoleJson {
            name: role.name.clone(),
            cluster_admin: role.cluster_admin,
            grants: role
                .grants
                .iter()
                .map(|g| (g.namespace.clone(), g.permission.clone()))
                .collect(),
        }
    }
}

#[derive(Serialize)]
struct TokenJson {
    id: String,
    name: String,
    role: String,
    created_at: String,
}

impl From<&Token> for TokenJson {
    fn from(token: &Token) -> Self {
        TokenJson {
            id: token.id.clone(),
            name: token.name.clone(),
            role: token.role.clone(),
            created_at: timefmt::format_unix_nanos(token.created_at).unwrap_or_default(),
        }
    }
}
