//! What a retry would do, for `rewind retry --dry-run`.

use crate::argo::plan::Plan;
use crate::engine::assess::{self, DeleteWork, Listed};

/// What a retry would do, for `rewind retry --dry-run`: the planner's plan
/// and the delete requests the controller would send for it now.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    pub workflow: String,
    pub nodes_reset: Vec<String>,
    pub nodes_deleted: Vec<String>,
    pub pods_to_delete: Vec<String>,
    /// Whether the workflow's pods could be listed. Without the list (a user
    /// may lack the right), the bulk path is unknown and the figures below
    /// assume one request per plan pod: an upper bound.
    pub pods_listed: bool,
    /// Plan pods one DeleteCollection would delete (0: no bulk path).
    pub bulk_pods: usize,
    /// Plan pods deleted (or released from Argo's finalizer) one request each.
    pub single_requests: usize,
    /// Mutating requests the retry costs: the deletes and the reset write.
    pub mutating_requests: usize,
    /// Time those requests take at the budget (after the burst), not counting
    /// the API server's own time for a bulk delete.
    pub estimated_seconds: f64,
}

/// The preview of `plan` for `workflow`, given its pods as listed now (if
/// they could be) and the controller's write budget.
pub fn preview(
    workflow: &str,
    plan: &Plan,
    pods: Option<&[Listed]>,
    allow_bulk: bool,
    qps: u32,
    burst: u32,
) -> Preview {
    let planned = plan.pods_to_delete.iter().cloned().collect();
    let assessment = match pods {
        Some(pods) => assess::assess(workflow, &planned, pods, allow_bulk),
        None => assess::Assessment {
            work: plan
                .pods_to_delete
                .iter()
                .map(|name| DeleteWork::Pod {
                    name: name.clone(),
                    uid: String::new(),
                })
                .collect(),
            ..Default::default()
        },
    };
    let bulk_pods = assessment
        .work
        .iter()
        .map(|w| match w {
            DeleteWork::Bulk { pods, .. } => pods.len(),
            _ => 0,
        })
        .sum();
    let single_requests = assessment
        .work
        .iter()
        .filter(|w| !matches!(w, DeleteWork::Bulk { .. }))
        .count();
    let mutating_requests = assessment.work.len() + 1;
    let estimated_seconds =
        mutating_requests.saturating_sub(burst as usize) as f64 / f64::from(qps.max(1));
    Preview {
        workflow: workflow.to_owned(),
        nodes_reset: plan.nodes_reset.clone(),
        nodes_deleted: plan.nodes_deleted.clone(),
        pods_to_delete: plan.pods_to_delete.clone(),
        pods_listed: pods.is_some(),
        bulk_pods,
        single_requests,
        mutating_requests,
        estimated_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argo::workflow::Workflow;

    fn pod(name: &str, phase: &str) -> Listed {
        Listed {
            name: name.into(),
            uid: format!("uid-{name}"),
            workflow: Some("wf".into()),
            completed: true,
            succeeded: phase == assess::SUCCEEDED,
            ..Listed::default()
        }
    }

    fn plan_of(pods: &[&str]) -> Plan {
        Plan {
            workflow: Workflow::default(),
            pods_to_delete: pods.iter().map(|p| p.to_string()).collect(),
            nodes_deleted: vec!["n1".into()],
            nodes_reset: vec!["n0".into()],
            pod_nodes: Default::default(),
        }
    }

    #[test]
    fn preview_counts_the_bulk_path_and_the_time_at_the_budget() {
        let names: Vec<String> = (0..100).map(|i| format!("p{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut pods: Vec<Listed> = names.iter().map(|n| pod(n, "Failed")).collect();
        pods.push(pod("kept", "Succeeded"));
        let plan = plan_of(&names);
        let bulk = preview("wf", &plan, Some(&pods), true, 20, 30);
        assert_eq!((bulk.bulk_pods, bulk.single_requests), (100, 0));
        assert_eq!((bulk.mutating_requests, bulk.estimated_seconds), (2, 0.0));
        assert_eq!(bulk.pods_to_delete.len(), 100);
        let single = preview("wf", &plan, Some(&pods), false, 20, 30);
        assert_eq!((single.bulk_pods, single.single_requests), (0, 100));
        // 101 writes, 30 in the burst, 71 at 20/s.
        assert_eq!(single.mutating_requests, 101);
        assert_eq!(single.estimated_seconds, 3.55);
        // Unlisted pods: the upper bound of one request each.
        let unknown = preview("wf", &plan, None, true, 20, 30);
        assert!(!unknown.pods_listed);
        assert_eq!((unknown.bulk_pods, unknown.mutating_requests), (0, 101));
    }
}
