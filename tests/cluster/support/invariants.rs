//! Invariants the fault tests check (issue 34, Build item 3), beside the pod ledger
//! (`rewind::testenv::ledger`): from the API server's audit log, the workflow's writes.

use anyhow::ensure;
use rewind::testenv::localcluster::{CONTROLLER_NAME, LocalCluster};

/// Each request's reset written at most once, and an archived retry's workflow created
/// at most once: the controller's writes of workflow `name` the API server took, from
/// its audit log (a live reset is the controller's one update of the workflow; its
/// status goes in patches).
pub fn ensure_written_at_most_once(
    cluster: &LocalCluster,
    namespace: &str,
    name: &str,
) -> anyhow::Result<()> {
    let log = super::controller::audit_log(cluster, namespace)?;
    let taken = |verb: &str, code: u16| {
        log.iter()
            .filter(|a| {
                a.user == CONTROLLER_NAME
                    && a.verb == verb
                    && a.resource == "workflows"
                    && a.name == name
                    && a.code == code
            })
            .count()
    };
    let (resets, creates) = (taken("update", 200), taken("create", 201));
    ensure!(
        resets <= 1 && creates <= 1,
        "workflow {namespace}/{name} was reset {resets} times and created {creates} times by the controller"
    );
    Ok(())
}
