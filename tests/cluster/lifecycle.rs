//! Starting and stopping a second, small cluster, and the errors a failed start gives.

use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, ensure};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use rewind::testenv::localcluster::{Component, Error, LocalCluster, Options};

pub async fn stop_leaves_no_process_and_no_directory(
    _shared: Arc<LocalCluster>,
    _namespace: String,
) -> anyhow::Result<()> {
    let cluster = LocalCluster::start(Options::default()).await?;
    let pids = cluster.pids();
    let dir = cluster.dir().to_owned();
    let components: Vec<Component> = pids.iter().map(|(c, _)| *c).collect();
    ensure!(
        components == [Component::Etcd, Component::ApiServer],
        "unexpected components {components:?}"
    );
    ensure!(dir.is_dir(), "{} missing while running", dir.display());
    let namespaces = Api::<Namespace>::all(cluster.admin_client())
        .list(&ListParams::default())
        .await?;
    ensure!(
        namespaces
            .items
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some("default")),
        "no default namespace"
    );

    cluster.stop().await?;
    for (component, pid) in pids {
        // Reaped by stop(), so not even a zombie is left.
        ensure!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{component} (pid {pid}) is still there"
        );
    }
    ensure!(!dir.exists(), "{} was not removed", dir.display());
    Ok(())
}

pub async fn a_taken_port_is_a_clear_error(
    _shared: Arc<LocalCluster>,
    _namespace: String,
) -> anyhow::Result<()> {
    let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let port = taken.local_addr()?.port();
    match LocalCluster::start(Options {
        api_port: Some(port),
        ..Options::default()
    })
    .await
    {
        Err(error @ Error::PortTaken { .. }) => {
            ensure!(
                error.to_string().contains(&port.to_string()),
                "message lacks the port: {error}"
            );
            Ok(())
        }
        Err(error) => bail!("expected PortTaken, got: {error}"),
        Ok(cluster) => {
            cluster.stop().await?;
            bail!("started on a taken port")
        }
    }
}

pub async fn a_missing_binary_is_a_clear_error(
    _shared: Arc<LocalCluster>,
    _namespace: String,
) -> anyhow::Result<()> {
    let empty = tempfile::tempdir()?;
    let options = Options {
        bin_dir: Some(empty.path().to_owned()),
        ..Options::default()
    };
    match LocalCluster::start(options).await {
        Err(error @ Error::BinaryMissing { name: "etcd", .. }) => {
            ensure!(
                error.to_string().contains("tools/controlplane/build.sh"),
                "message lacks the build command: {error}"
            );
            Ok(())
        }
        Err(error) => bail!("expected BinaryMissing for etcd, got: {error}"),
        Ok(cluster) => {
            cluster.stop().await?;
            bail!("started without binaries")
        }
    }
}

pub async fn a_component_exiting_at_startup_is_a_clear_error_with_its_log(
    _shared: Arc<LocalCluster>,
    _namespace: String,
) -> anyhow::Result<()> {
    let options = Options {
        extra_apiserver_args: vec!["--no-such-flag".into()],
        ..Options::default()
    };
    match LocalCluster::start(options).await {
        Err(
            error @ Error::Exited {
                component: Component::ApiServer,
                ..
            },
        ) => {
            ensure!(
                error.to_string().contains("no-such-flag"),
                "message lacks the log's complaint: {error}"
            );
            Ok(())
        }
        Err(error) => bail!("expected kube-apiserver to exit, got: {error}"),
        Ok(cluster) => {
            cluster.stop().await?;
            bail!("started with an unknown flag")
        }
    }
}
