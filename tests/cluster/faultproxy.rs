//! The fault proxy (`rewind::testenv::faultproxy`) against the real API server: each fault
//! kind does what the fault tests rely on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::StreamExt as _;
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};
use rewind::testenv::faultproxy::{Fault, FaultProxy, Matcher, Rule};
use rewind::testenv::ledger::current_version;
use rewind::testenv::localcluster::{LocalCluster, Role};
use tokio_util::sync::CancellationToken;

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// Names in the next watch events, until `until` arrives, the stream ends or `timeout`.
async fn watched_names(
    events: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin),
    until: &str,
    timeout: Duration,
) -> (Vec<String>, &'static str) {
    let mut names = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => return (names, "timeout"),
            Ok(None) => return (names, "ended"),
            Ok(Some(Err(_))) => return (names, "error"),
            Ok(Some(Ok(WatchEvent::Added(cm) | WatchEvent::Modified(cm)))) => {
                let name = cm.metadata.name.unwrap_or_default();
                let done = name == until;
                names.push(name);
                if done {
                    return (names, "arrived");
                }
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

pub async fn the_fault_proxy_holds_throttles_stalls_cuts_drops_and_serves_stale_lists(
    cluster: Arc<LocalCluster>,
    namespace: String,
) -> anyhow::Result<()> {
    let proxy = FaultProxy::start(&cluster).await?;
    let mut config = proxy.config(&cluster, Role::Admin).await?;
    // The 429 must reach the test, not kube's own retry.
    config.default_retry = false;
    let through: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(config)?, &namespace);
    let direct: Api<ConfigMap> = Api::namespaced(cluster.admin_client(), &namespace);
    let path = format!("/namespaces/{namespace}/configmaps");
    let list = Matcher::new(Method::GET, &path).watch(false);
    let lp = ListParams::default();

    // Hold for a time.
    let rule = proxy.add(Rule::new(list.clone(), Fault::Hold(Duration::from_millis(500))).times(1));
    let started = Instant::now();
    through.list(&lp).await.context("a held list")?;
    let held = started.elapsed();
    ensure!(
        held >= Duration::from_millis(500),
        "a list held 500 ms took {held:?}"
    );
    ensure!(proxy.seen_matching(&list).len() == 1, "{:?}", proxy.seen());
    proxy.remove(rule);

    // Hold until released, and the arrival is visible meanwhile.
    let release = CancellationToken::new();
    proxy.add(Rule::new(list.clone(), Fault::HoldUntil(release.clone())).times(1));
    let since = Instant::now();
    let pending = tokio::spawn({
        let through = through.clone();
        async move { through.list(&ListParams::default()).await }
    });
    let seen = proxy
        .wait_for(&list, since, Duration::from_secs(10))
        .await?;
    ensure!(seen.method == Method::GET && !seen.watch, "{seen:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !pending.is_finished(),
        "a list held until released was answered"
    );
    release.cancel();
    pending.await?.context("the released list")?;

    // 429 with Retry-After, then the next request goes through.
    let create = Matcher::new(Method::POST, &path);
    proxy.add(
        Rule::new(
            create.clone(),
            Fault::TooManyRequests {
                retry_after_seconds: 3,
            },
        )
        .times(1),
    );
    match through
        .create(&PostParams::default(), &config_map("throttled"))
        .await
    {
        Err(kube::Error::Api(status)) if status.code == 429 => {}
        other => bail!("a throttled create answered {other:?}, not 429"),
    }
    ensure!(
        direct.get_opt("throttled").await?.is_none(),
        "a throttled create reached the API server"
    );
    through
        .create(&PostParams::default(), &config_map("throttled"))
        .await?;

    // Dropped events: the watch never shows the dropped object, and shows the next.
    let version = current_version(&direct).await?;
    let watch = Matcher::new(Method::GET, &path).watch(true);
    let drop = proxy.add(Rule::new(
        watch.clone(),
        Fault::DropEvents {
            containing: "dropped-one".into(),
        },
    ));
    let mut events = through
        .watch(&WatchParams::default(), &version)
        .await?
        .boxed();
    direct
        .create(&PostParams::default(), &config_map("dropped-one"))
        .await?;
    direct
        .create(&PostParams::default(), &config_map("kept-one"))
        .await?;
    let (names, how) = watched_names(&mut events, "kept-one", Duration::from_secs(10)).await;
    ensure!(
        how == "arrived" && names == ["kept-one"],
        "a watch dropping dropped-one showed {names:?} ({how})"
    );
    proxy.remove(drop);

    // A skipping watch shows the latest state of what it held back once released, and only it.
    let version = current_version(&direct).await?;
    let healed = CancellationToken::new();
    let skip = proxy.add(Rule::new(
        watch.clone(),
        Fault::SkipEvents {
            containing: "skipped-one".into(),
            until: healed.clone(),
        },
    ));
    let mut events = through
        .watch(&WatchParams::default(), &version)
        .await?
        .boxed();
    direct
        .create(&PostParams::default(), &config_map("skipped-one"))
        .await?;
    let mut latest = direct.get("skipped-one").await?;
    latest.data = Some([("state".to_owned(), "latest".to_owned())].into());
    let latest = direct
        .replace("skipped-one", &PostParams::default(), &latest)
        .await?;
    direct
        .create(&PostParams::default(), &config_map("after-skipped"))
        .await?;
    let (names, how) = watched_names(&mut events, "after-skipped", Duration::from_secs(10)).await;
    ensure!(
        how == "arrived" && names == ["after-skipped"],
        "a watch skipping skipped-one showed {names:?} ({how}) before its release"
    );
    healed.cancel();
    proxy.remove(skip);
    let released = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .context("the held-back event never came after the release")?;
    let Some(Ok(WatchEvent::Modified(cm))) = released else {
        bail!("expected the latest state of skipped-one after the release, got {released:?}");
    };
    ensure!(
        cm.metadata.name.as_deref() == Some("skipped-one")
            && cm.metadata.resource_version == latest.metadata.resource_version,
        "after the release the watch showed {:?} at {:?}, not skipped-one at its latest {:?}",
        cm.metadata.name,
        cm.metadata.resource_version,
        latest.metadata.resource_version
    );

    // A stalled watch shows nothing more; a cut one ends after its first event.
    let version = current_version(&direct).await?;
    let stall = proxy.add(Rule::new(
        watch.clone(),
        Fault::StallWatch { after_events: 0 },
    ));
    let mut stalled = through
        .watch(&WatchParams::default(), &version)
        .await?
        .boxed();
    proxy.remove(stall);
    let cut = proxy.add(Rule::new(
        watch.clone(),
        Fault::CutWatch { after_events: 1 },
    ));
    let mut broken = through
        .watch(&WatchParams::default(), &version)
        .await?
        .boxed();
    proxy.remove(cut);
    let mut healthy = through
        .watch(&WatchParams::default(), &version)
        .await?
        .boxed();
    direct
        .create(&PostParams::default(), &config_map("first"))
        .await?;
    direct
        .create(&PostParams::default(), &config_map("second"))
        .await?;
    let (names, how) = watched_names(&mut healthy, "second", Duration::from_secs(10)).await;
    ensure!(
        how == "arrived" && names == ["first", "second"],
        "healthy: {names:?} ({how})"
    );
    let (names, how) = watched_names(&mut stalled, "second", Duration::from_secs(2)).await;
    ensure!(
        how == "timeout" && names.is_empty(),
        "stalled: {names:?} ({how})"
    );
    let (names, how) = watched_names(&mut broken, "second", Duration::from_secs(10)).await;
    ensure!(
        how != "arrived" && how != "timeout" && names == ["first"],
        "cut after one event: {names:?} ({how})"
    );

    // A stale list: the API server's own view at an older resourceVersion.
    let older = current_version(&direct).await?;
    direct
        .create(&PostParams::default(), &config_map("newer"))
        .await?;
    proxy.add(
        Rule::new(
            list.clone(),
            Fault::StaleList {
                resource_version: older.clone(),
            },
        )
        .times(1),
    );
    let stale = through.list(&lp).await?;
    let stale_names: Vec<_> = stale
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    ensure!(
        !stale_names.contains(&"newer".to_owned())
            && stale_names.contains(&"second".to_owned())
            && stale.metadata.resource_version.as_deref() == Some(&older),
        "a list at {older} showed {stale_names:?} at {:?}",
        stale.metadata.resource_version
    );
    let fresh = through.list(&lp).await?;
    ensure!(
        fresh
            .items
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("newer")),
        "the next list was stale too"
    );
    Ok(())
}
