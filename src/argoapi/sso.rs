//! Argo's SSO (`--auth-mode sso`): which account Argo's server acts as for an
//! SSO user, told as its gatekeeper tells it (server/auth/gatekeeper.go,
//! v4.1.4: `getClients`, `rbacAuthorization`, `getServiceAccount`).
//!
//! Only the Argo Server decodes its `v2:` tokens, so rewind asks it who the
//! caller is (`GET /api/v1/userinfo`). Without SSO RBAC Argo acts as itself
//! for every SSO user (the ServiceAccount fields of userinfo then come from the
//! user's claims, and are ignored). With it, userinfo names the login account:
//! the ServiceAccount of the Argo Server's namespace whose
//! `workflows.argoproj.io/rbac-rule` matches the user. With
//! `SSO_DELEGATE_RBAC_TO_NAMESPACE=true`, a call on another namespace acts as
//! that namespace's matching account instead when its precedence is higher;
//! userinfo has no namespace, so rewind reads the namespace's accounts and
//! evaluates their rules itself, on the claims userinfo reports. Where it
//! cannot know what Argo's server would pick, it refuses: never more than Argo.

use std::collections::BTreeSet;

use axum::http::header::AUTHORIZATION;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ListParams};
use serde::Deserialize;
use tracing::info;

use crate::argoapi::wire::{Code, Status};
use crate::engine::fault;

/// The annotation holding a ServiceAccount's rule (Argo's `AnnotationKeyRBACRule`).
pub const RULE: &str = "workflows.argoproj.io/rbac-rule";
/// The annotation holding its precedence (`AnnotationKeyRBACRulePrecedence`).
pub const PRECEDENCE: &str = "workflows.argoproj.io/rbac-rule-precedence";

/// How the Argo Server in front runs SSO.
#[derive(Clone)]
pub struct Sso {
    /// A client of the Argo Server, for `/api/v1/userinfo`.
    pub argo_server: kube::Client,
    /// Its `sso.rbac.enabled`.
    pub rbac: bool,
    /// Whether it runs with `SSO_DELEGATE_RBAC_TO_NAMESPACE=true` (and not `--namespaced`).
    pub delegate: bool,
}

/// What `GET /api/v1/userinfo` answers (info.proto GetUserInfoResponse): the
/// claims of the caller's token, then the account Argo's server acts as.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UserInfo {
    pub issuer: String,
    pub subject: String,
    /// `null`, absent and empty alike: protojson omits an empty repeated field.
    pub groups: Option<Vec<String>>,
    pub email: String,
    pub name: String,
    pub service_account_name: String,
    pub service_account_namespace: String,
}

impl UserInfo {
    /// The login account userinfo names (with SSO RBAC: the Argo Server's own
    /// namespace's account whose rule matches the user, as a call without a
    /// namespace gets).
    fn login_account(&self) -> Option<Named> {
        (!self.service_account_name.is_empty() && !self.service_account_namespace.is_empty()).then(
            || Named {
                namespace: self.service_account_namespace.clone(),
                name: self.service_account_name.clone(),
            },
        )
    }
}

/// A ServiceAccount by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub namespace: String,
    pub name: String,
}

/// Whom a call acts as, as Argo's server would pick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The Argo Server's own ServiceAccount (SSO without SSO RBAC).
    ArgoServer,
    /// A ServiceAccount, and how it was picked (for logs and messages).
    Account(Named, &'static str),
}

const LOGIN: &str = "SSO (the ServiceAccount Argo's SSO RBAC maps the user to)";
const DELEGATED: &str = "SSO (the ServiceAccount of the call's namespace Argo's SSO RBAC delegates the user to, SSO_DELEGATE_RBAC_TO_NAMESPACE)";

/// The 401 of a token the Argo Server refused.
fn unauthenticated(argo: &str, hint: &str) -> Status {
    Status::new(Code::Unauthenticated, format!("{argo} — {hint}"))
}

/// The 403 Argo's gatekeeper answers when SSO RBAC finds no account ("not allowed").
fn not_allowed(hint: &str) -> Status {
    Status::new(Code::PermissionDenied, format!("not allowed — {hint}"))
}

impl Sso {
    /// Who the caller of `token` is, as the Argo Server that issued it says.
    pub async fn user_info(&self, token: &str) -> Result<UserInfo, Status> {
        let request = axum::http::Request::get("/api/v1/userinfo")
            .header(AUTHORIZATION, token)
            .body(Vec::new())
            .expect("a request of a fixed path and a header from a request builds");
        let text = match self.argo_server.request_text(request).await {
            Ok(text) => text,
            Err(e) => {
                return Err(match refusal(&e) {
                    Some((Code::PermissionDenied, message)) => Status::new(
                        Code::PermissionDenied,
                        format!(
                            "{message} — the Argo Server's SSO RBAC maps this user to no ServiceAccount of its namespace (no workflows.argoproj.io/rbac-rule there matches their claims, or one fails to evaluate), so it refuses their calls (rewind, which learns who they are from it alone, too: its userinfo names no namespace, so even a call it would delegate to the namespace's account is refused here); ask for an account in the Argo Server's namespace whose rule matches you"
                        ),
                    ),
                    Some((_, message)) => unauthenticated(
                        message,
                        "the Argo Server refused this SSO token; log in to Argo's UI again",
                    ),
                    None => Status::new(
                        Code::Unavailable,
                        format!(
                            "asking the Argo Server who the SSO caller is (GET /api/v1/userinfo) failed: {}; check --argo-server-url and that the Argo Server runs",
                            fault::explain(&e)
                        ),
                    ),
                });
            }
        };
        serde_json::from_str(&text).map_err(|e| {
            Status::new(
                Code::Internal,
                format!("the Argo Server's /api/v1/userinfo answer is not Argo's GetUserInfoResponse ({e}); is --argo-server-url an Argo Server?"),
            )
        })
    }

    /// Whether a call on `namespace` is delegated to that namespace's
    /// accounts, which must then be read: Argo delegates a call naming another
    /// namespace than its own (gatekeeper's canDelegateRBACToRequestNamespace);
    /// its own namespace is the login account's.
    pub fn delegates(&self, info: &UserInfo, namespace: &str) -> bool {
        self.rbac
            && self.delegate
            && !namespace.is_empty()
            && info
                .login_account()
                .is_some_and(|login| login.namespace != namespace)
    }

    /// The account Argo's server acts as for `info`'s user in a call on `namespace`.
    pub async fn caller(
        &self,
        client: &kube::Client,
        info: &UserInfo,
        namespace: &str,
    ) -> Result<Caller, Status> {
        if !self.rbac {
            // Argo copies userinfo's account fields from the user's claims then, and acts
            // as itself whatever they say.
            return Ok(Caller::ArgoServer);
        }
        let Some(login) = info.login_account() else {
            return Err(not_allowed(
                "the Argo Server named no ServiceAccount for this SSO user, which with SSO RBAC (--argo-api-sso-rbac=true) it always does; is the Argo Server's sso.rbac.enabled off? Set --argo-api-sso-rbac as it",
            ));
        };
        if !self.delegates(info, namespace) {
            return Ok(Caller::Account(login, LOGIN));
        }
        let login_precedence = login_precedence(client, &login).await?;
        let candidates = candidates(client, namespace).await?;
        let claims = Claims::of(info);
        let selection = select(login_precedence, &candidates, &claims);
        info!(
            subject = info.subject,
            email = info.email,
            login = login.name,
            namespace,
            ?selection,
            "SSO RBAC delegation to the call's namespace"
        );
        match selection {
            Selection::Login => Ok(Caller::Account(login, LOGIN)),
            Selection::Delegated(i) => Ok(Caller::Account(
                Named {
                    namespace: namespace.to_owned(),
                    name: candidates[i].name.clone(),
                },
                DELEGATED,
            )),
            Selection::Unsure(why) => Err(not_allowed(&format!(
                "with SSO_DELEGATE_RBAC_TO_NAMESPACE, Argo's server acts in namespace {namespace} as the account there whose workflows.argoproj.io/rbac-rule matches the user, if its precedence is above the login account {}/{}'s ({login_precedence}), and rewind cannot tell which it would pick: {why}; nothing was done",
                login.namespace, login.name,
            ))),
        }
    }
}

/// The precedence of the login account, read from the cluster (userinfo names it only).
async fn login_precedence(client: &kube::Client, login: &Named) -> Result<i64, Status> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &login.namespace);
    let what = || format!("ServiceAccount {}/{}", login.namespace, login.name);
    match accounts.get_metadata_opt(&login.name).await {
        Ok(Some(account)) => Ok(precedence(
            account
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(PRECEDENCE))
                .map(String::as_str),
        )),
        Ok(None) => Err(Status::new(
            Code::Unavailable,
            format!(
                "the Argo Server named {} as this SSO user's login account and it is gone; ask again",
                what()
            ),
        )),
        Err(e) => Err(reading_failed(&what(), &e)),
    }
}

/// The ServiceAccounts of `namespace` carrying a rule, as Argo's server lists them.
async fn candidates(client: &kube::Client, namespace: &str) -> Result<Vec<Candidate>, Status> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    // From the watch cache, as Argo's server reads them from its informer.
    let list = accounts
        .list_metadata(&ListParams::default().match_any())
        .await
        .map_err(|e| {
            reading_failed(&format!("the ServiceAccounts of namespace {namespace}"), &e)
        })?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|account| {
            let annotations = account.metadata.annotations.unwrap_or_default();
            Some(Candidate {
                name: account.metadata.name?,
                rule: annotations.get(RULE)?.clone(),
                precedence: precedence(annotations.get(PRECEDENCE).map(String::as_str)),
            })
        })
        .collect())
}

/// A read of ServiceAccounts that failed: the API server's trouble, or rewind's rights.
fn reading_failed(what: &str, e: &kube::Error) -> Status {
    let code = if fault::is_transient(e) {
        Code::Unavailable
    } else {
        Code::Internal
    };
    let rights = match fault::api_code(e) {
        Some(403) => {
            "; rewind's ServiceAccount needs get and list on serviceaccounts for SSO RBAC delegation (the chart grants it with argoApi.sso.delegateRBACToNamespace, deploy/rbac/argo-api-sso.yaml)"
        }
        _ => "",
    };
    Status::new(
        code,
        format!("reading {what} failed: {}{rights}", fault::explain(e)),
    )
}

/// The code and message of the Argo Server's refusal, if `e` is one. kube reads an error
/// answer's body as a Kubernetes Status, and Argo's body is a rendered gRPC status: its
/// `code` (16 Unauthenticated, 7 PermissionDenied) stands where the HTTP status would. A
/// body that is no JSON (from a proxy in between) keeps the HTTP status.
fn refusal(e: &kube::Error) -> Option<(Code, &str)> {
    match e {
        kube::Error::Api(s) => match s.code {
            401 | 16 => Some((Code::Unauthenticated, &s.message)),
            403 | 7 => Some((Code::PermissionDenied, &s.message)),
            _ => None,
        },
        _ => None,
    }
}

/// A precedence as Go's `strconv.Atoi` reads it, errors ignored as Argo ignores them: a
/// number (a sign allowed), clamped to the integer's range; anything else 0.
pub fn precedence(annotation: Option<&str>) -> i64 {
    use std::num::IntErrorKind;
    match annotation.unwrap_or_default().parse::<i64>() {
        Ok(n) => n,
        Err(e) => match e.kind() {
            IntErrorKind::PosOverflow => i64::MAX,
            IntErrorKind::NegOverflow => i64::MIN,
            _ => 0,
        },
    }
}

/// A ServiceAccount carrying a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub rule: String,
    pub precedence: i64,
}

/// The claims a rule is evaluated on: Argo's `Claims` as `jsonutil.Jsonify` makes it a map
/// (its JSON names, empty fields omitted), as far as userinfo reports them.
pub struct Claims {
    env: expr::Context,
    /// Claim names Argo's map lacks for this user: a rule naming one fails to compile.
    absent: BTreeSet<&'static str>,
}

/// Names of Argo's claims that its login never fills (go-jose's `aud`, `nbf`, `iat`,
/// `jti`), or that its JSON leaves out (`EmailVerified` is `json:"-"`).
const NEVER_SET: [&str; 5] = ["aud", "nbf", "iat", "jti", "email_verified"];

/// Names of Argo's claims that userinfo does not report: `exp` is always set, and the
/// others come from the identity provider (userinfo's account fields are the picked
/// account's, not the claims').
const UNREPORTED: [&str; 4] = [
    "exp",
    "preferred_username",
    "service_account_name",
    "service_account_namespace",
];

impl Claims {
    pub fn of(info: &UserInfo) -> Claims {
        let mut env = expr::Context::default();
        let mut absent: BTreeSet<&'static str> = NEVER_SET.into();
        for (key, value) in [
            ("iss", &info.issuer),
            ("sub", &info.subject),
            ("email", &info.email),
            ("name", &info.name),
        ] {
            if value.is_empty() {
                absent.insert(key);
            } else {
                env.insert(key, expr::Value::String(value.clone()));
            }
        }
        match info.groups.as_deref() {
            Some(groups) if !groups.is_empty() => env.insert(
                "groups",
                expr::Value::Array(groups.iter().cloned().map(expr::Value::String).collect()),
            ),
            _ => {
                absent.insert("groups");
            }
        }
        Claims { env, absent }
    }
}

/// What evaluating a rule on a user's claims gives, as Argo's `argoexpr.EvalBool` would.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Match,
    NoMatch,
    /// Argo's evaluation fails too (a missing claim, a runtime error, not a boolean).
    Failed(String),
    /// rewind cannot know what Argo's evaluation gives.
    Unsure(String),
}

/// `rule` on `claims`. Argo compiles a rule against the claims' map, so a name missing from
/// it fails the rule even where evaluation would not reach it (`a || b`); expr-lang's
/// evaluator is lazy, so the rule's names are checked first.
pub fn evaluate(rule: &str, claims: &Claims) -> Outcome {
    for name in free_names(rule) {
        if claims.env.get(name).is_some() {
            continue;
        }
        if claims.absent.contains(name) {
            return Outcome::Failed(format!(
                "unknown name {name}: Argo's claims of this user have none"
            ));
        }
        if UNREPORTED.contains(&name) {
            return Outcome::Unsure(format!(
                "it reads the claim {name}, which the Argo Server's /api/v1/userinfo does not report"
            ));
        }
        return Outcome::Unsure(format!(
            "it reads {name}, which is none of the claims Argo evaluates rules on (iss, sub, groups, email, name, …) nor a name rewind sees the rule bind"
        ));
    }
    let program = match expr::compile(rule) {
        Ok(program) => program,
        // A grammar is never quite another's: what expr-lang cannot parse, Argo's Go
        // expr might.
        Err(e) => {
            return Outcome::Unsure(format!(
                "rewind's expr-lang cannot parse it ({e}), and cannot tell whether Argo's can"
            ));
        }
    };
    match expr::run(&program, &claims.env) {
        Ok(expr::Value::Bool(true)) => Outcome::Match,
        Ok(expr::Value::Bool(false)) => Outcome::NoMatch,
        Ok(other) => Outcome::Failed(format!("it gives {other}, not a boolean")),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// The expr-lang words that are operators or literals, never a variable.
const KEYWORDS: [&str; 14] = [
    "in",
    "not",
    "and",
    "or",
    "matches",
    "contains",
    "startsWith",
    "endsWith",
    "true",
    "false",
    "nil",
    "let",
    "if",
    "else",
];

/// The names `rule` reads from its environment, by a scan of its words (expr-lang's crate
/// keeps its syntax tree private): each word outside strings and comments that is no
/// keyword, no member (after `.` or `?.`), no predicate's `#name`, no function called and
/// no `let` binding. Written by hand for that reason; it errs towards more names (a map
/// literal's keys count), which only makes [`evaluate`] unsure, never wrong.
fn free_names(rule: &str) -> BTreeSet<&str> {
    let bytes = rule.as_bytes();
    let mut names = BTreeSet::new();
    let mut bound = BTreeSet::new();
    // The last two bytes before the current word that are not whitespace.
    let (mut prev, mut prev2) = (0u8, 0u8);
    let mut after_let = false;
    let mut i = 0;
    let skip_to = |from: usize, end: &[u8]| {
        rule[from..]
            .find(std::str::from_utf8(end).expect("ASCII"))
            .map_or(bytes.len(), |at| from + at + end.len())
    };
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'\'' || c == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != c {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == b'`' {
            i = skip_to(i + 1, b"`");
        } else if bytes[i..].starts_with(b"//") {
            i = skip_to(i, b"\n");
            continue;
        } else if bytes[i..].starts_with(b"/*") {
            i = skip_to(i + 2, b"*/");
            continue;
        } else if c.is_ascii_digit() {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b'$' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'$')
            {
                i += 1;
            }
            let word = &rule[start..i];
            let next = rule[i..].trim_start().bytes().next();
            let member = (prev == b'.' && prev2 != b'.') || prev == b'#';
            if after_let {
                bound.insert(word);
            } else if !member && next != Some(b'(') && !KEYWORDS.contains(&word) {
                names.insert(word);
            }
            after_let = word == "let";
            (prev2, prev) = (prev, b'a');
            continue;
        } else if !c.is_ascii_whitespace() {
            i += 1;
            (prev2, prev) = (prev, c);
            after_let = false;
            continue;
        } else {
            i += 1;
            continue;
        }
        (prev2, prev) = (prev, b'"');
        after_let = false;
    }
    names.retain(|n| !bound.contains(n));
    names
}

/// Which account a call on another namespace acts as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// The login account, as when there is no delegation.
    Login,
    /// The namespace's candidate of this index.
    Delegated(usize),
    /// rewind cannot know which Argo's server would pick: why.
    Unsure(String),
}

/// Argo's choice for a call on a namespace whose accounts with a rule are `candidates`,
/// for a user with `claims` whose login account has `login_precedence`. Argo sorts the
/// candidates by precedence (highest first, ties in no set order), takes the first whose
/// rule matches, and delegates to it if its precedence is above the login account's; a rule
/// that fails to evaluate ends the search, and the login account is used.
///
/// So no account at or below the login's precedence can be picked, and their rules need
/// not be evaluated. Among accounts of equal precedence Argo's order is its informer's, in
/// effect random: where the first decisive ones of a precedence disagree (two match, or one
/// matches and another fails), rewind cannot know Argo's pick.
pub fn select(login_precedence: i64, candidates: &[Candidate], claims: &Claims) -> Selection {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(candidates[i].precedence));
    for tie in order.chunk_by(|&a, &b| candidates[a].precedence == candidates[b].precedence) {
        let precedence = candidates[tie[0]].precedence;
        if precedence <= login_precedence {
            break;
        }
        let mut matched = Vec::new();
        let mut failed = Vec::new();
        for &i in tie {
            let name = &candidates[i].name;
            match evaluate(&candidates[i].rule, claims) {
                Outcome::NoMatch => {}
                Outcome::Match => matched.push(i),
                Outcome::Failed(why) => failed.push(format!("{name}'s rule fails ({why})")),
                Outcome::Unsure(why) => {
                    return Selection::Unsure(format!(
                        "ServiceAccount {name}'s rule (precedence {precedence}): {why}"
                    ));
                }
            }
        }
        match (matched.as_slice(), failed.is_empty()) {
            ([], true) => continue,
            // Argo stops at a failing rule and keeps the login account.
            ([], false) => return Selection::Login,
            ([one], true) => return Selection::Delegated(*one),
            _ => {
                let mut said: Vec<String> = matched
                    .iter()
                    .map(|&i| format!("{}'s rule matches", candidates[i].name))
                    .collect();
                said.extend(failed);
                return Selection::Unsure(format!(
                    "ServiceAccounts of the same precedence ({precedence}) disagree: {}, and Argo's server takes whichever it lists first; give them different precedences",
                    said.join(", ")
                ));
            }
        }
    }
    Selection::Login
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(groups: &[&str], email: &str) -> UserInfo {
        UserInfo {
            issuer: "argo-server".into(),
            subject: "CiQwOGE4Njg0Yi1kYjg4".into(),
            groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            email: email.into(),
            ..Default::default()
        }
    }

    fn candidate(name: &str, rule: &str, precedence: i64) -> Candidate {
        Candidate {
            name: name.into(),
            rule: rule.into(),
            precedence,
        }
    }

    #[test]
    fn userinfo_reads_argos_answer_with_or_without_empty_fields() {
        let full: UserInfo = serde_json::from_str(
            r#"{"issuer":"argo-server","subject":"s","groups":["a"],"email":"a@x","emailVerified":false,"serviceAccountName":"sa","serviceAccountNamespace":"argo","name":"A"}"#,
        )
        .unwrap();
        assert_eq!(
            full.login_account(),
            Some(Named {
                namespace: "argo".into(),
                name: "sa".into()
            })
        );
        let bare: UserInfo =
            serde_json::from_str(r#"{"issuer":"argo-server","groups":null}"#).unwrap();
        assert_eq!(bare.login_account(), None);
        assert_eq!(bare.groups, None);
    }

    #[test]
    fn precedence_is_read_as_gos_atoi_reads_it() {
        for (text, expected) in [
            (Some("2"), 2),
            (Some("+3"), 3),
            (Some("-1"), -1),
            (Some("007"), 7),
            (None, 0),
            (Some(""), 0),
            (Some("high"), 0),
            (Some(" 1"), 0),
            (Some("1.5"), 0),
            (Some("1_000"), 0),
            (Some("+"), 0),
            (Some("99999999999999999999"), i64::MAX),
            (Some("-99999999999999999999"), i64::MIN),
        ] {
            assert_eq!(precedence(text), expected, "{text:?}");
        }
    }

    #[test]
    fn rules_of_argos_docs_and_tests_evaluate_on_the_claims_it_jsonifies() {
        let alice = Claims::of(&info(&["admin", "my-group"], "alice@example.com"));
        for (rule, expected) in [
            ("'admin' in groups", Outcome::Match),
            ("'my-team' in groups", Outcome::NoMatch),
            ("'argo_admins' in groups", Outcome::NoMatch),
            ("true", Outcome::Match),
            ("email == 'alice@example.com'", Outcome::Match),
            ("email == \"bob@example.com\"", Outcome::NoMatch),
            (
                "email endsWith '@example.com' and iss == 'argo-server'",
                Outcome::Match,
            ),
            ("email matches '^alice@'", Outcome::Match),
            ("any(groups, # startsWith 'my-')", Outcome::Match),
            ("'admin' not in groups", Outcome::NoMatch),
            ("let team = 'admin'; team in groups", Outcome::Match),
            ("sub != ''", Outcome::Match),
        ] {
            assert_eq!(evaluate(rule, &alice), expected, "{rule}");
        }
    }

    #[test]
    fn a_rule_naming_a_claim_the_user_lacks_fails_as_argos_compiler_fails_it() {
        // Go's expr v1.17.8 on Argo's map: "unknown name groups" at compile time, even where
        // evaluation would not reach it (checked against Go: expr.Compile with expr.Env).
        let no_groups = Claims::of(&info(&[], "a@x"));
        for rule in [
            "'admin' in groups",
            "email == 'a@x' || 'admin' in groups",
            "name == 'A'",
            "email_verified",
            "aud == 'x'",
        ] {
            assert!(
                matches!(evaluate(rule, &no_groups), Outcome::Failed(_)),
                "{rule}: {:?}",
                evaluate(rule, &no_groups)
            );
        }
        // Evaluation errors and non-booleans fail too (Argo: "unable to evaluate"/"cast").
        assert!(matches!(
            evaluate("email > 1", &no_groups),
            Outcome::Failed(_)
        ));
        assert!(matches!(evaluate("'x'", &no_groups), Outcome::Failed(_)));
    }

    #[test]
    fn a_rule_rewind_cannot_evaluate_as_argo_is_unsure() {
        let alice = Claims::of(&info(&["admin"], "alice@example.com"));
        for rule in [
            "preferred_username == 'alice'",
            "exp > 0",
            "service_account_name == 'x'",
            "claims.groups == nil",
            "$env.email != ''",
            "'admin' in groups and",
        ] {
            assert!(
                matches!(evaluate(rule, &alice), Outcome::Unsure(_)),
                "{rule}: {:?}",
                evaluate(rule, &alice)
            );
        }
    }

    #[test]
    fn free_names_skip_strings_members_calls_comments_and_bindings() {
        let names = |rule| free_names(rule).into_iter().collect::<Vec<_>>();
        assert_eq!(names("'groups' in groups"), ["groups"]);
        assert_eq!(names(r#""a\"b email" == email"#), ["email"]);
        assert_eq!(names("len(groups) > 0 && x.y?.z"), ["groups", "x"]);
        assert_eq!(
            names("all(groups, {#.size > 1 && #index >= 0})"),
            ["groups"]
        );
        assert_eq!(names("let a = 1; a < 2 // sub\n/* name */ or iss"), ["iss"]);
        assert_eq!(names("1..n"), ["n"]);
        assert_eq!(names("1.5e3 > 2 and not false"), Vec::<&str>::new());
        assert_eq!(names("`raw email`"), Vec::<&str>::new());
    }

    /// Argo's own cases (server/auth/gatekeeper_test.go, TestServer_GetWFClient): a user in
    /// my-group and other-group, whose login account is my-ns/my-sa (precedence 1).
    #[test]
    fn delegation_picks_as_argos_gatekeeper_tests_do() {
        let user = Claims::of(&info(&["my-group", "other-group"], ""));
        // user1-ns: user1-sa (2) matches, above my-sa's 1: delegated.
        let user1 = [
            candidate("user1-only-sa", "'user1-only-group' in groups", 0),
            candidate("user1-sa", "'my-group' in groups", 2),
        ];
        assert_eq!(select(1, &user1, &user), Selection::Delegated(1));
        // user2-ns: 0 and user3-ns: 1 are not above the login's 1.
        let user2 = [candidate("user2-sa", "'my-group' in groups", 0)];
        assert_eq!(select(1, &user2, &user), Selection::Login);
        let user3 = [candidate("user3-sa", "'my-group' in groups", 1)];
        assert_eq!(select(1, &user3, &user), Selection::Login);
        // Nothing matches: the login account.
        let other = [candidate("x", "'nobody' in groups", 5)];
        assert_eq!(select(1, &other, &user), Selection::Login);
        assert_eq!(select(1, &[], &user), Selection::Login);
    }

    #[test]
    fn the_highest_match_wins_and_a_failing_rule_ends_the_search() {
        let user = Claims::of(&info(&["dev"], "a@x"));
        let accounts = [
            candidate("low", "true", 2),
            candidate("high", "'dev' in groups", 9),
            candidate("mid", "email == 'a@x'", 5),
        ];
        assert_eq!(select(0, &accounts, &user), Selection::Delegated(1));
        // A failing rule above the matching ones: Argo stops there and keeps the login.
        let failing = [
            candidate("broken", "name == 'A'", 7),
            candidate("ok", "true", 3),
        ];
        assert_eq!(select(0, &failing, &user), Selection::Login);
        // A failing rule below the login's precedence is never reached.
        assert_eq!(select(3, &failing[..1], &user), Selection::Login);
        // A non-number precedence counts 0, not above a login of 0.
        assert_eq!(
            select(0, &[candidate("n", "true", precedence(Some("x")))], &user),
            Selection::Login
        );
    }

    #[test]
    fn ties_that_argo_breaks_at_random_and_unknowable_rules_refuse() {
        let user = Claims::of(&info(&["dev"], "a@x"));
        let two = [
            candidate("a", "true", 4),
            candidate("b", "'dev' in groups", 4),
        ];
        assert!(
            matches!(select(0, &two, &user), Selection::Unsure(m) if m.contains("same precedence (4)"))
        );
        let mixed = [candidate("a", "true", 4), candidate("b", "name == 'x'", 4)];
        assert!(matches!(select(0, &mixed, &user), Selection::Unsure(_)));
        // A tie where only one is decisive is no tie.
        let one = [candidate("a", "false", 4), candidate("b", "true", 4)];
        assert_eq!(select(0, &one, &user), Selection::Delegated(1));
        // Two failures: the login either way.
        let fails = [
            candidate("a", "name == 'x'", 4),
            candidate("b", "aud == 'y'", 4),
        ];
        assert_eq!(select(0, &fails, &user), Selection::Login);
        let unknowable = [candidate("u", "preferred_username == 'a'", 4)];
        assert!(
            matches!(select(0, &unknowable, &user), Selection::Unsure(m) if m.contains("ServiceAccount u's rule"))
        );
        // Unless the login's precedence makes it moot.
        assert_eq!(select(4, &unknowable, &user), Selection::Login);
    }

    /// Without SSO RBAC, with no delegation or on the Argo Server's own namespace, no
    /// ServiceAccount is read: a client of nothing serves.
    #[tokio::test]
    async fn the_login_account_is_taken_from_userinfo_only_with_sso_rbac() {
        let nowhere = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(nowhere).unwrap();
        let sso = |rbac, delegate| Sso {
            argo_server: client.clone(),
            rbac,
            delegate,
        };
        let mut named = info(&["admin"], "a@x");
        named.service_account_name = "admin".into();
        named.service_account_namespace = "argo".into();
        let login = Caller::Account(
            Named {
                namespace: "argo".into(),
                name: "admin".into(),
            },
            LOGIN,
        );
        // Argo copies these fields from the user's claims without SSO RBAC: ignored.
        assert_eq!(
            sso(false, true).caller(&client, &named, "team").await,
            Ok(Caller::ArgoServer)
        );
        assert_eq!(
            sso(true, false).caller(&client, &named, "team").await,
            Ok(login.clone())
        );
        assert_eq!(
            sso(true, true).caller(&client, &named, "argo").await,
            Ok(login)
        );
        let refused = sso(true, false)
            .caller(&client, &info(&["admin"], "a@x"), "team")
            .await
            .unwrap_err();
        assert_eq!(refused.code, Code::PermissionDenied);
        assert!(
            refused.message.starts_with("not allowed — ")
                && refused.message.contains("--argo-api-sso-rbac"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn argo_servers_refusals_are_told_by_grpc_or_http_code() {
        let answer = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "")
                    .with_code(code)
                    .boxed(),
            )
        };
        // Argo's body, as kube reads it: the gRPC code.
        assert_eq!(
            refusal(&answer(16, "failed to decrypt token")),
            Some((Code::Unauthenticated, "failed to decrypt token"))
        );
        assert_eq!(
            refusal(&answer(7, "not allowed")),
            Some((Code::PermissionDenied, "not allowed"))
        );
        // A proxy's plain-text 401.
        assert_eq!(
            refusal(&answer(401, "Unauthorized")),
            Some((Code::Unauthenticated, "Unauthorized"))
        );
        assert_eq!(refusal(&answer(503, "no upstream")), None);
    }
}
