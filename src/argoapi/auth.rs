//! Who calls, and whether Argo's server would let them: never weaker than
//! Argo's own gatekeeper (server/auth/gatekeeper.go, v4.1.4).
//!
//! The token is read where Argo reads it (the `Authorization` header, else an
//! `authorization` cookie, as the UI sets), and its mode is told as Argo's
//! `Modes.GetMode` tells it: `Bearer v2:` is SSO, another `Bearer` token is a
//! Kubernetes token (client mode), and in server mode any caller is the Argo
//! Server's own account. Then one SubjectAccessReview per permission Argo's
//! server would use as the caller. Nothing is asked of the cluster for the
//! retry before both passed.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::argoapi::review::Reviews;
use crate::argoapi::sso::{Caller, Named, Sso, UserInfo};
use crate::argoapi::wire::{Code, Status};
use crate::engine::fault;
use crate::protocol::crd::AskedBy;

/// Argo's words for a token no allowed mode takes (gatekeeper.getClients).
const TOKEN_NOT_VALID: &str =
    "token not valid. see https://argo-workflows.readthedocs.io/en/latest/faq/";

/// SSO tokens carry this prefix (Argo's `sso.Prefix`): only Argo's server decodes them.
const SSO_PREFIX: &str = "Bearer v2:";

/// One of Argo's `--auth-mode` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AuthMode {
    /// The caller's bearer token is a Kubernetes token; the call acts as its user.
    Client,
    /// Every caller acts as the Argo Server's own ServiceAccount.
    Server,
    /// Argo's SSO: the Argo Server says who the caller is.
    Sso,
}

impl FromStr for AuthMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "client" => Ok(AuthMode::Client),
            "server" => Ok(AuthMode::Server),
            "sso" => Ok(AuthMode::Sso),
            other => Err(format!(
                "unknown auth mode {other:?}: Argo's --auth-mode takes client, server or sso"
            )),
        }
    }
}

/// A ServiceAccount, as `NAMESPACE/NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub namespace: String,
    pub name: String,
}

impl FromStr for Account {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => Ok(Account {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
            _ => Err(format!(
                "{s:?} is no ServiceAccount: give it as NAMESPACE/NAME (e.g. argo/argo-server)"
            )),
        }
    }
}

impl Account {
    /// The caller the API server sees when this account's token is used.
    fn identity(&self, how: &'static str) -> Identity {
        let Account { namespace, name } = self;
        Identity {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            uid: None,
            extra: BTreeMap::new(),
            how,
        }
    }
}

/// How callers are told apart, as the Argo installation in front does.
#[derive(Clone)]
pub struct Authenticator {
    pub modes: Vec<AuthMode>,
    /// The Argo Server's own ServiceAccount: whom server mode (and SSO
    /// without SSO RBAC, where Argo acts as itself) is authorized as.
    pub server_account: Option<Account>,
    /// The Argo Server's SSO: whom to ask who an SSO caller is, and its RBAC.
    pub sso: Option<Sso>,
}

/// The caller, as the API server would see them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub uid: Option<String>,
    pub extra: BTreeMap<String, Vec<String>>,
    /// How the caller was told (for logs and messages).
    pub how: &'static str,
}

/// The tokens a call carries, in the order Argo's gatekeeper tries them:
/// the `Authorization` header alone when present, else every
/// `authorization` cookie (a wildcard-domain cookie can add a second one).
pub fn tokens(headers: &HeaderMap) -> Vec<String> {
    if let Some(header) = headers.get(AUTHORIZATION) {
        return vec![String::from_utf8_lossy(header.as_bytes()).into_owned()];
    }
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|h| h.to_str().unwrap_or_default().split(';'))
        .filter_map(|c| c.trim().strip_prefix("authorization="))
        .map(|v| v.trim_matches('"').to_owned())
        .collect()
}

/// The mode a token is served in (Argo's `Modes.GetMode`), if any allowed.
pub fn mode_of(modes: &[AuthMode], token: &str) -> Option<AuthMode> {
    if modes.contains(&AuthMode::Sso) && token.starts_with(SSO_PREFIX) {
        return Some(AuthMode::Sso);
    }
    if modes.contains(&AuthMode::Client)
        && (token.starts_with("Bearer ") || token.starts_with("Basic "))
    {
        return Some(AuthMode::Client);
    }
    modes
        .contains(&AuthMode::Server)
        .then_some(AuthMode::Server)
}

/// The 401 every refused token gets: Argo's words, then what rewind takes.
fn unauthenticated(argo: &str, hint: &str) -> Status {
    Status::new(Code::Unauthenticated, format!("{argo} — {hint}"))
}

/// Who a call's token is. An SSO user's account may depend on the call's
/// namespace (delegation), which an archived call names in its body: that
/// choice waits for [`Authenticator::acting_as`], so the body is read only
/// once the token is known good.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Authenticated {
    /// The caller the API server will see.
    Known(Identity),
    /// An SSO user, as the Argo Server that issued the token names them.
    Sso(Box<UserInfo>),
}

impl Authenticated {
    /// Who asks, as recorded on the request: the reviewed user, or an SSO
    /// user by email (else subject) with the groups their login carries.
    pub fn asker(&self) -> AskedBy {
        match self {
            Authenticated::Known(identity) => AskedBy {
                user: identity.user.clone(),
                groups: identity.groups.clone(),
                acting_as: None,
            },
            Authenticated::Sso(info) => AskedBy {
                user: if info.email.is_empty() {
                    info.subject.clone()
                } else {
                    info.email.clone()
                },
                groups: info.groups.clone().unwrap_or_default(),
                acting_as: None,
            },
        }
    }
}

impl Authenticator {
    /// Who makes the call with `headers` from `source`; 401 when nobody Argo
    /// would accept. A token is reviewed within the reviews' budget.
    pub async fn authenticate(
        &self,
        reviews: &Reviews<Authenticated>,
        source: IpAddr,
        headers: &HeaderMap,
    ) -> Result<Authenticated, Status> {
        let mut tokens = tokens(headers);
        if tokens.is_empty() {
            tokens.push(String::new());
        }
        let Some((token, mode)) = tokens
            .iter()
            .find_map(|t| Some((t.as_str(), mode_of(&self.modes, t)?)))
        else {
            let hint = if tokens.iter().all(String::is_empty) {
                "the call carried no token; send a Kubernetes bearer token (`argo` reads ARGO_TOKEN, e.g. \"Bearer $(kubectl create token NAME)\"), or log in to Argo's UI"
            } else {
                "rewind serves the auth modes this installation's Argo Server runs in; send \"Bearer \" and a Kubernetes token, or log in to Argo's UI again"
            };
            return Err(unauthenticated(TOKEN_NOT_VALID, hint));
        };
        match mode {
            AuthMode::Client => {
                let ask = async {
                    review(reviews.client(), token)
                        .await
                        .map(Authenticated::Known)
                };
                reviews.identity(source, token, ask).await
            }
            AuthMode::Server => Ok(Authenticated::Known(self.server_identity("server mode")?)),
            AuthMode::Sso => {
                let sso = self.sso()?;
                let ask = async {
                    let info = sso.user_info(token).await?;
                    Ok(Authenticated::Sso(Box::new(info)))
                };
                reviews.identity(source, token, ask).await
            }
        }
    }

    /// Whom Argo's server acts as for `who` in a call on `namespace`: an SSO
    /// user's account is picked as its SSO RBAC picks it
    /// ([`sso`](crate::argoapi::sso)); reading the namespace's accounts for
    /// delegation is a review, within the budget.
    pub async fn acting_as(
        &self,
        reviews: &Reviews<Authenticated>,
        source: IpAddr,
        who: Authenticated,
        namespace: &str,
    ) -> Result<Identity, Status> {
        let info = match who {
            Authenticated::Known(identity) => return Ok(identity),
            Authenticated::Sso(info) => info,
        };
        let sso = self.sso()?;
        let caller = if sso.delegates(&info, namespace) {
            reviews
                .spend(source, sso.caller(reviews.client(), &info, namespace))
                .await??
        } else {
            sso.caller(reviews.client(), &info, namespace).await?
        };
        match caller {
            Caller::Account(Named { namespace, name }, how) => {
                Ok(Account { namespace, name }.identity(how))
            }
            // Without SSO RBAC, Argo's server acts as itself for SSO users.
            Caller::ArgoServer => {
                self.server_identity("SSO without SSO RBAC (the Argo Server's own ServiceAccount)")
            }
        }
    }

    /// The Argo Server's SSO, which alone decodes an SSO token.
    fn sso(&self) -> Result<&Sso, Status> {
        self.sso.as_ref().ok_or_else(|| {
            unauthenticated(
                TOKEN_NOT_VALID,
                "this is an Argo SSO token, which only the Argo Server decodes, and rewind was given no Argo Server to ask (--argo-server-url)",
            )
        })
    }

    fn server_identity(&self, how: &'static str) -> Result<Identity, Status> {
        match &self.server_account {
            Some(account) => Ok(account.identity(how)),
            None => Err(Status::new(
                Code::Internal,
                "rewind does not know the Argo Server's ServiceAccount, which this call acts as; set --argo-server-service-account (the chart's argoApi.argoServer.serviceAccount)",
            )),
        }
    }
}

/// The user a Kubernetes token stands for (TokenReview).
async fn review(client: &kube::Client, token: &str) -> Result<Identity, Status> {
    let Some(bearer) = token.strip_prefix("Bearer ") else {
        return Err(unauthenticated(
            "token not valid: basic authentication is not a Kubernetes token",
            "rewind checks callers with a TokenReview; send \"Bearer \" and a Kubernetes token",
        ));
    };
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(bearer.trim().to_owned()),
            audiences: None,
        },
        ..Default::default()
    };
    let answer = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| asking_failed("a TokenReview of the caller's token", "tokenreviews", &e))?;
    let status = answer.status.unwrap_or_default();
    match (status.authenticated, status.user) {
        (Some(true), Some(user)) => Ok(Identity {
            user: user.username.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            uid: user.uid,
            extra: user.extra.unwrap_or_default(),
            how: "client mode (a Kubernetes token)",
        }),
        _ => Err(unauthenticated(
            &format!(
                "token not valid: {}",
                status
                    .error
                    .as_deref()
                    .unwrap_or("the API server does not know it")
            ),
            "the Kubernetes API server does not accept this token (expired, revoked or tampered with); get a new one (e.g. `kubectl create token NAME`)",
        )),
    }
}

/// A review rewind could not ask: its own rights, or the API server's trouble.
fn asking_failed(what: &str, resource: &str, e: &kube::Error) -> Status {
    let code = if fault::is_transient(e) {
        Code::Unavailable
    } else {
        Code::Internal
    };
    let rights = match fault::api_code(e) {
        Some(403) => format!(
            "; rewind's ServiceAccount needs create on {resource} (the chart's ClusterRole and deploy/rbac grant it)"
        ),
        _ => String::new(),
    };
    Status::new(
        code,
        format!("asking {what} failed: {}{rights}", fault::explain(e)),
    )
}

/// One permission Argo's server uses as the caller for a retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permission {
    pub verb: &'static str,
    pub resource: Resource,
    pub namespace: String,
    /// The object's name, when the check is about one.
    pub name: Option<String>,
}

/// What a permission is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    /// argoproj.io workflows.
    Workflows,
    /// Pods, which Argo's server deletes as the caller.
    Pods,
}

impl Resource {
    fn group(self) -> &'static str {
        match self {
            Resource::Workflows => "argoproj.io",
            Resource::Pods => "",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Resource::Workflows => "workflows",
            Resource::Pods => "pods",
        }
    }

    /// As RBAC and kubectl name it: `workflows.argoproj.io`, `pods`.
    fn qualified(self) -> String {
        match self.group() {
            "" => self.plural().to_owned(),
            group => format!("{}.{group}", self.plural()),
        }
    }
}

/// Whether `who` holds every permission of `needed`; 403 naming the first
/// one missing. Each review is asked within the reviews' budget.
pub async fn authorize(
    reviews: &Reviews<Authenticated>,
    source: IpAddr,
    who: &Identity,
    needed: &[Permission],
    why: &str,
) -> Result<(), Status> {
    for permission in needed {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.user.clone()),
                groups: Some(who.groups.clone()),
                uid: who.uid.clone(),
                extra: (!who.extra.is_empty()).then(|| who.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(permission.resource.group().into()),
                    resource: Some(permission.resource.plural().into()),
                    verb: Some(permission.verb.into()),
                    namespace: Some(permission.namespace.clone()),
                    name: permission.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api = Api::<SubjectAccessReview>::all(reviews.client().clone());
        let answer = reviews
            .spend(source, api.create(&PostParams::default(), &review))
            .await?
            .map_err(|e| {
                asking_failed(
                    "a SubjectAccessReview of the caller",
                    "subjectaccessreviews",
                    &e,
                )
            })?;
        if !answer.status.is_some_and(|s| s.allowed) {
            return Err(denied(who, permission, why));
        }
    }
    Ok(())
}

/// The 403 of a missing permission: Argo's words, then which one and what to do.
pub fn denied(who: &Identity, permission: &Permission, why: &str) -> Status {
    let Permission {
        verb,
        resource,
        namespace,
        ..
    } = permission;
    let resource = resource.qualified();
    Status::new(
        Code::PermissionDenied,
        format!(
            "permission denied — {user} ({how}) may not {verb} {resource} in namespace {namespace}, which {why}; nothing was done; ask for it (e.g. Argo's argo-edit role, or a Role granting {verb} on {resource} in {namespace})",
            user = who.user,
            how = who.how,
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(axum::http::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn tokens_come_from_the_header_first_then_every_authorization_cookie() {
        assert!(tokens(&HeaderMap::new()).is_empty());
        let both = headers(&[
            (AUTHORIZATION, "Bearer abc"),
            (COOKIE, "authorization=Bearer v2:x"),
        ]);
        assert_eq!(tokens(&both), ["Bearer abc"]);
        let cookies = headers(&[
            (COOKIE, "a=1; authorization=Bearer v2:x"),
            (COOKIE, "authorization=\"Bearer y\""),
        ]);
        assert_eq!(tokens(&cookies), ["Bearer v2:x", "Bearer y"]);
    }

    #[test]
    fn modes_are_told_as_argos_gatekeeper_tells_them() {
        use AuthMode::*;
        let all = [Client, Server, Sso];
        assert_eq!(mode_of(&all, "Bearer v2:abc"), Some(Sso));
        assert_eq!(mode_of(&all, "Bearer abc"), Some(Client));
        assert_eq!(mode_of(&all, "Basic abc"), Some(Client));
        assert_eq!(mode_of(&all, ""), Some(Server));
        assert_eq!(mode_of(&all, "garbage"), Some(Server));
        // An SSO token where SSO is off is a client token, as in Argo.
        assert_eq!(mode_of(&[Client], "Bearer v2:abc"), Some(Client));
        assert_eq!(mode_of(&[Client], ""), None);
        assert_eq!(mode_of(&[Sso], "Bearer abc"), None);
        assert_eq!(mode_of(&[Server], "Bearer abc"), Some(Server));
    }

    #[test]
    fn settings_parse_with_clear_errors() {
        assert_eq!("sso".parse::<AuthMode>(), Ok(AuthMode::Sso));
        assert!(
            "hybrid"
                .parse::<AuthMode>()
                .unwrap_err()
                .contains("client, server or sso")
        );
        assert_eq!(
            "argo/argo-server".parse::<Account>(),
            Ok(Account {
                namespace: "argo".into(),
                name: "argo-server".into()
            })
        );
        for bad in ["argo", "/x", "x/"] {
            assert!(
                bad.parse::<Account>()
                    .unwrap_err()
                    .contains("NAMESPACE/NAME"),
                "{bad}"
            );
        }
        let who = Account {
            namespace: "argo".into(),
            name: "argo-server".into(),
        }
        .identity("server mode");
        assert_eq!(who.user, "system:serviceaccount:argo:argo-server");
        assert!(
            who.groups
                .contains(&"system:serviceaccounts:argo".to_owned())
        );
    }

    #[test]
    fn a_denial_names_the_user_verb_and_namespace() {
        let who = Account {
            namespace: "team".into(),
            name: "alice".into(),
        }
        .identity("client mode (a Kubernetes token)");
        let status = denied(
            &who,
            &Permission {
                verb: "update",
                resource: Resource::Workflows,
                namespace: "team".into(),
                name: Some("wf".into()),
            },
            "Argo's server needs to retry a workflow",
        );
        assert_eq!(status.code, Code::PermissionDenied);
        assert!(status.message.starts_with("permission denied — system:serviceaccount:team:alice (client mode (a Kubernetes token)) may not update workflows.argoproj.io in namespace team"), "{}", status.message);
    }
}
