//! The control plane's components and the command line each runs with.

use std::fmt;
use std::path::Path;

use super::layout::Layout;
use super::ports::Ports;
use super::{Options, Role};

/// One process of the local control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Component {
    Etcd,
    ApiServer,
    ControllerManager,
    Scheduler,
    Kwok,
}

impl Component {
    /// The name of its binary in the directory tools/controlplane/build.sh prints.
    pub fn binary(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
            Component::Kwok => "kwok",
        }
    }

    /// The components a cluster with these options runs, in start order.
    pub(super) fn needed(options: &Options) -> Vec<Component> {
        let mut needed = vec![Component::Etcd, Component::ApiServer];
        if options.scheduling {
            needed.extend([
                Component::ControllerManager,
                Component::Scheduler,
                Component::Kwok,
            ]);
        }
        needed
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.binary())
    }
}

/// Service IPs; they only need to stay clear of kwok's pod IPs ([`POD_CIDR`]).
const SERVICE_CIDR: &str = "10.96.0.0/16";
/// Pod IPs kwok hands out: room for tens of thousands of simulated pods.
pub(super) const POD_CIDR: &str = "10.0.0.0/16";

/// Logs every request once, when its response is complete, at Metadata level (who did
/// what to which object, no bodies): enough to count requests per verb and second.
pub(super) const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
";

pub(super) fn args(
    component: Component,
    layout: &Layout,
    ports: &Ports,
    options: &Options,
) -> Vec<String> {
    match component {
        Component::Etcd => etcd(layout, ports),
        Component::ApiServer => api_server(layout, ports, options),
        Component::ControllerManager => controller_manager(layout, ports),
        Component::Scheduler => scheduler(layout, ports),
        Component::Kwok => kwok(layout),
    }
}

fn path(flag: &str, path: impl AsRef<Path>) -> String {
    format!("--{flag}={}", path.as_ref().display())
}

fn etcd(layout: &Layout, ports: &Ports) -> Vec<String> {
    let client = format!("http://127.0.0.1:{}", ports.etcd_client);
    let peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
    vec![
        "--name=rewind".into(),
        path("data-dir", layout.etcd_data()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=rewind={peer}"),
        // A throwaway cluster: durability is worth nothing, write speed is.
        "--unsafe-no-fsync".into(),
        "--log-level=warn".into(),
    ]
}

fn api_server(layout: &Layout, ports: &Ports, options: &Options) -> Vec<String> {
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{}", ports.etcd_client),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={}", ports.api),
        path("tls-cert-file", layout.serving_cert()),
        path("tls-private-key-file", layout.serving_key()),
        path("client-ca-file", layout.ca_cert()),
        path("token-auth-file", layout.token_file()),
        "--authorization-mode=Node,RBAC".into(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        path(
            "service-account-key-file",
            layout.service_account_public_key(),
        ),
        path(
            "service-account-signing-key-file",
            layout.service_account_key(),
        ),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        // The `kubernetes` Service cannot point at a loopback address; nothing here needs it.
        "--endpoint-reconciler-type=none".into(),
        "--profiling=false".into(),
    ];
    if options.audit {
        args.extend([
            path("audit-policy-file", layout.audit_policy()),
            path("audit-log-path", layout.audit_log()),
            "--audit-log-format=json".into(),
            // Written as each request completes, so a test can read it right after acting.
            "--audit-log-mode=blocking".into(),
        ]);
    }
    args.extend(options.extra_apiserver_args.iter().cloned());
    args
}

/// Flags shared by kube-controller-manager and kube-scheduler: the admin credential for
/// everything (a test cluster needs no per-controller identities) and a loopback port.
fn control_loop(layout: &Layout, port: u16) -> Vec<String> {
    let kubeconfig = layout.kubeconfig(Role::Admin);
    vec![
        path("kubeconfig", &kubeconfig),
        path("authentication-kubeconfig", &kubeconfig),
        path("authorization-kubeconfig", &kubeconfig),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        // Our API server has no front-proxy (request-header) CA for them to look up.
        "--authentication-skip-lookup=true".into(),
        "--leader-elect=false".into(),
    ]
}

fn controller_manager(layout: &Layout, ports: &Ports) -> Vec<String> {
    let mut args = control_loop(layout, ports.controller_manager);
    args.extend([
        path(
            "service-account-private-key-file",
            layout.service_account_key(),
        ),
        path("root-ca-file", layout.ca_cert()),
    ]);
    args
}

fn scheduler(layout: &Layout, ports: &Ports) -> Vec<String> {
    control_loop(layout, ports.scheduler)
}

fn kwok(layout: &Layout) -> Vec<String> {
    vec![
        path("kubeconfig", layout.kubeconfig(Role::Admin)),
        path("config", layout.kwok_config()),
        "--manage-all-nodes=false".into(),
        format!(
            "--manage-nodes-with-annotation-selector={}",
            super::kwok::NODE_SELECTOR
        ),
        format!("--cidr={POD_CIDR}"),
        "--node-ip=127.0.0.1".into(),
        // Leases keep the fake nodes Ready between kwok's rare status heartbeats, as kwokctl does.
        "--node-lease-duration-seconds=40".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports() -> Ports {
        Ports {
            etcd_client: 1,
            etcd_peer: 2,
            api: 3,
            controller_manager: 4,
            scheduler: 5,
        }
    }

    #[test]
    fn api_server_authorizes_with_rbac_and_audits_only_when_asked() {
        let layout = Layout::new("/c".into());
        let plain = args(Component::ApiServer, &layout, &ports(), &Options::default());
        assert!(plain.contains(&"--authorization-mode=Node,RBAC".to_owned()));
        assert!(plain.contains(&"--secure-port=3".to_owned()));
        assert!(plain.contains(&"--etcd-servers=http://127.0.0.1:1".to_owned()));
        assert!(!plain.iter().any(|a| a.starts_with("--audit")));

        let options = Options {
            audit: true,
            extra_apiserver_args: vec!["--max-requests-inflight=7".into()],
            ..Options::default()
        };
        let audited = args(Component::ApiServer, &layout, &ports(), &options);
        assert!(audited.contains(&"--audit-log-path=/c/audit.log".to_owned()));
        assert_eq!(
            audited.last().map(String::as_str),
            Some("--max-requests-inflight=7")
        );
    }

    #[test]
    fn scheduling_adds_the_control_loops_and_kwok() {
        assert_eq!(
            Component::needed(&Options::default()),
            [Component::Etcd, Component::ApiServer]
        );
        let options = Options {
            scheduling: true,
            ..Options::default()
        };
        assert_eq!(Component::needed(&options).len(), 5);
    }
}
