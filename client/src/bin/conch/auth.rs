//! `conch auth …`: access control management (turn it on and off, roles, tokens).
//!
//! Every command needs a cluster-admin token while access control is on. `token create`
//! writes the new token to `--out FILE`, created readable by its owner only, or else prints it
//! alone on stdout; what it is goes to stderr; the token is never shown again. The file is
//! opened before the token is created, so a file that cannot be written costs no token.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
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
use crate::exit::{self, Exit};
use crate::timefmt;

/// A file the new token goes to, opened (mode 0600) before the token is created.
struct TokenFile {
    file: File,
    /// Where the token is written: the file itself, or (with `--force`) a new file beside it
    /// that then replaces it.
    written: PathBuf,
    target: PathBuf,
}

impl TokenFile {
    /// Creates `target` (refused if it exists), or with `force` a new file beside it, readable
    /// and writable by the owner only.
    fn open(target: &Path, force: bool) -> anyhow::Result<TokenFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let written = if force {
            let name = target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            target.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
        } else {
            target.to_path_buf()
        };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&written)
            .map_err(|e| {
                let message = if e.kind() == std::io::ErrorKind::AlreadyExists && !force {
                    format!(
                        "--out {}: the file exists; pass --force to replace it",
                        target.display()
                    )
                } else {
                    format!("--out {}: {e}", target.display())
                };
                Exit {
                    code: exit::USAGE,
                    message,
                }
            })?;
        Ok(TokenFile {
            file,
            written,
            target: target.to_path_buf(),
        })
    }

    /// Writes the token and puts the file in place.
    fn commit(mut self, secret: &str) -> anyhow::Result<()> {
        let result = self
            .file
            .write_all(format!("{secret}\n").as_bytes())
            .and_then(|()| self.file.sync_all())
            .and_then(|()| {
                if self.written == self.target {
                    Ok(())
                } else {
                    std::fs::rename(&self.written, &self.target)
                }
            });
        result.map_err(|e| {
            let _ = std::fs::remove_file(&self.written);
            anyhow::anyhow!(
                "write the token to {}: {e} (the token was created: revoke it and create another)",
                self.target.display()
            )
        })
    }

    /// Removes the file: no token came.
    fn abandon(self) {
        let _ = std::fs::remove_file(&self.written);
    }
}

pub(crate) async fn run(client: &Client, command: AuthCommand) -> anyhow::Result<ExitCode> {
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
        TokenCommand::Create {
            name,
            role,
            out,
            force,
        } => {
            let file = out
                .as_deref()
                .map(|path| TokenFile::open(path, force))
                .transpose()?;
            let created = client
                .call("create token", opts, |ch, t| {
                    let req = TokenCreateRequest {
                        name: name.clone(),
                        role: role.clone(),
                    };
                    async move { ConchAuthClient::new(ch).token_create(request(req, t)).await }
                })
                .await;
            let r = match created {
                Ok(r) => r,
                Err(e) => {
                    file.into_iter().for_each(TokenFile::abandon);
                    return Err(e.into());
                }
            };
            let what = r.token.as_ref().map_or_else(String::new, |token| {
                format!("token {} ({}, role {})", token.id, token.name, token.role)
            });
            match file {
                Some(file) => {
                    let target = file.target.display().to_string();
                    file.commit(&r.secret)?;
                    eprintln!(
                        "conch: {what} written to {target} (mode 0600); it is shown only this once"
                    );
                }
                None => {
                    eprintln!("conch: {what} created; it is shown only this once");
                    crate::print_lines([r.secret])?;
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_token_file_is_private_and_never_replaced_unasked() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ci.token");
        // a new file: 0600, the token and a newline
        TokenFile::open(&out, false)
            .unwrap()
            .commit("conch_abc")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "conch_abc\n");
        assert_eq!(mode(&out), 0o600);
        // an existing file is refused, and left as it was
        let refused = TokenFile::open(&out, false).err().expect("refused");
        assert!(refused.to_string().contains("--force"), "{refused}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "conch_abc\n");
        // --force replaces it, private even if the old one was not
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
        TokenFile::open(&out, true)
            .unwrap()
            .commit("conch_def")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "conch_def\n");
        assert_eq!(mode(&out), 0o600);
        // a token that never came leaves no file behind
        let other = dir.path().join("other.token");
        TokenFile::open(&other, false).unwrap().abandon();
        assert!(!other.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
