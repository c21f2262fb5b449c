//! The caller of Argo's retry calls in the benchmarks: a ServiceAccount with what Argo's
//! server needs of a caller to retry, and a token for it.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, PostParams};

/// A token, valid for `lasting`, of ServiceAccount `namespace/account`, created here with
/// what Argo's server needs of a caller to retry (it deletes the pods as the caller),
/// cluster-wide.
pub async fn token(
    admin: &kube::Client,
    namespace: &str,
    account: &str,
    lasting: Duration,
) -> Result<String, kube::Error> {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    accounts
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: meta(account),
                ..Default::default()
            },
        )
        .await?;
    let rule = |group: &str, resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(vec![resource.into()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    };
    let role = ClusterRole {
        metadata: meta("bench-retrier"),
        rules: Some(vec![
            rule(
                "argoproj.io",
                "workflows",
                &["get", "list", "watch", "update", "patch"],
            ),
            rule("", "pods", &["get", "list", "delete"]),
        ]),
        ..Default::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding = ClusterRoleBinding {
        metadata: meta("bench-retrier"),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "bench-retrier".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.into(),
            namespace: Some(namespace.into()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(lasting.as_secs() as i64),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await?;
    Ok(answer.status.map(|s| s.token).unwrap_or_default())
}
