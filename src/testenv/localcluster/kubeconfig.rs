//! Credentials: the API server's static token file and one kubeconfig per user.

use std::path::Path;

use base64::Engine as _;
use serde_json::json;

use super::Role;

/// The unprivileged user: in no group but system:authenticated, so it can do only what RBAC grants.
pub const USER_NAME: &str = "rewind-user";
/// The admin user, in system:masters (allowed everything, whatever RBAC says).
pub const ADMIN_NAME: &str = "rewind-admin";
/// The controller's identity, allowed what deploy/rbac/controller.yaml grants (and, as test
/// setup, Argo's ConfigMap and Secrets and Leases anywhere: see `rbac`).
pub const CONTROLLER_NAME: &str = "rewind-controller";

/// A user of the local cluster and the bearer token that authenticates it.
pub(super) struct Credential {
    pub role: Role,
    pub token: String,
}

impl Credential {
    pub fn random(role: Role) -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)?;
        // URL-safe base64 has no commas, which would break the token file's CSV.
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        Ok(Self { role, token })
    }

    fn user(&self) -> &'static str {
        match self.role {
            Role::Admin => ADMIN_NAME,
            Role::User => USER_NAME,
            Role::Controller => CONTROLLER_NAME,
        }
    }

    fn groups(&self) -> &'static str {
        match self.role {
            Role::Admin => "system:masters",
            Role::User | Role::Controller => "",
        }
    }
}

/// kube-apiserver's --token-auth-file: `token,user,uid,"group1,group2"` per line.
pub(super) fn token_file(credentials: &[&Credential]) -> String {
    credentials
        .iter()
        .map(|c| format!("{},{},{},\"{}\"\n", c.token, c.user(), c.user(), c.groups()))
        .collect()
}

/// A kubeconfig with one cluster, user and context, trusting only our CA.
pub(super) fn render(server_url: &str, ca_file: &Path, credential: &Credential) -> String {
    let name = format!("rewind-local-{}", credential.user());
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "rewind-local",
            "cluster": {"server": server_url, "certificate-authority": ca_file},
        }],
        "users": [{"name": credential.user(), "user": {"token": credential.token}}],
        "contexts": [{
            "name": name,
            "context": {"cluster": "rewind-local", "user": credential.user(), "namespace": "default"},
        }],
        "current-context": name,
    });
    serde_yaml_ng::to_string(&config).expect("a JSON value always serializes to YAML")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_parses_and_selects_the_user() {
        let credential = Credential::random(Role::User).unwrap();
        let yaml = render(
            "https://127.0.0.1:6443",
            Path::new("/x/ca.crt"),
            &credential,
        );
        let parsed: kube::config::Kubeconfig = serde_yaml_ng::from_str(&yaml).unwrap();
        assert_eq!(
            parsed.current_context.as_deref(),
            Some("rewind-local-rewind-user")
        );
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority.as_deref(), Some("/x/ca.crt"));
        assert_eq!(parsed.auth_infos[0].name, USER_NAME);
    }

    #[test]
    fn token_file_puts_only_the_admin_in_system_masters() {
        let admin = Credential::random(Role::Admin).unwrap();
        let user = Credential::random(Role::User).unwrap();
        assert_ne!(admin.token, user.token);
        let file = token_file(&[&admin, &user]);
        let lines: Vec<&str> = file.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(
            lines[0].ends_with(",rewind-admin,rewind-admin,\"system:masters\""),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].ends_with(",rewind-user,rewind-user,\"\""),
            "{}",
            lines[1]
        );
    }
}
