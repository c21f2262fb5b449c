//! Rights for the unprivileged test user ([`USER_NAME`]) in a test's namespace, and for
//! ServiceAccounts that call Argo's retry API with their tokens.

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, PostParams};
use rewind::testenv::localcluster::{USER_NAME, service_account_token};

/// `verbs` on `resource` of API group `group`.
pub fn rule(group: &str, resource: &str, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }
}

pub fn named(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..Default::default()
    }
}

/// Creates Role `name` with `rules` in `namespace` and binds it to the test user.
pub async fn grant_user(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    rules: Vec<PolicyRule>,
) -> anyhow::Result<()> {
    let role = Role {
        metadata: named(name),
        rules: Some(rules),
    };
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await
        .with_context(|| format!("creating Role {name}"))?;
    bind_user(admin, namespace, "Role", name).await
}

/// Binds `kind` (Role or ClusterRole) `name` to the test user in `namespace`, with a
/// RoleBinding of the same name.
pub async fn bind_user(
    admin: &kube::Client,
    namespace: &str,
    kind: &str,
    name: &str,
) -> anyhow::Result<()> {
    let binding = RoleBinding {
        metadata: named(name),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: kind.into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: USER_NAME.into(),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .with_context(|| format!("binding {kind} {name} to {USER_NAME}"))?;
    Ok(())
}

/// `verbs` on workflows.
pub fn workflow_verbs(verbs: &[&str]) -> PolicyRule {
    rule("argoproj.io", "workflows", verbs)
}

/// Deleting pods, which Argo's server does as the caller in a retry.
pub fn delete_pods() -> PolicyRule {
    rule("", "pods", &["delete"])
}

/// A ServiceAccount `name` in `namespace` holding `rules` there (none: no Role), and a
/// token of it.
pub async fn account(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    rules: &[PolicyRule],
) -> anyhow::Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    accounts
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: named(name),
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("creating ServiceAccount {name}"))?;
    if !rules.is_empty() {
        Api::<Role>::namespaced(admin.clone(), namespace)
            .create(
                &PostParams::default(),
                &Role {
                    metadata: named(name),
                    rules: Some(rules.to_vec()),
                },
            )
            .await?;
        Api::<RoleBinding>::namespaced(admin.clone(), namespace)
            .create(
                &PostParams::default(),
                &RoleBinding {
                    metadata: named(name),
                    role_ref: RoleRef {
                        api_group: "rbac.authorization.k8s.io".into(),
                        kind: "Role".into(),
                        name: name.into(),
                    },
                    subjects: Some(vec![Subject {
                        kind: "ServiceAccount".into(),
                        name: name.into(),
                        namespace: Some(namespace.into()),
                        ..Default::default()
                    }]),
                },
            )
            .await?;
    }
    Ok(service_account_token(&accounts, name).await?)
}
