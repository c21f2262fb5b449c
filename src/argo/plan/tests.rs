//! One test per retry rule, on small hand-made workflows.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;

const NOW: &str = "2030-01-02T03:04:05Z";

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

/// A node as JSON: id, type, phase, children.
fn node(id: &str, name: &str, type_: &str, phase: &str, children: &[&str]) -> Value {
    json!({"id": id, "name": name, "displayName": name, "type": type_, "phase": phase,
           "templateName": "t", "startedAt": "2024-01-01T00:00:00Z", "finishedAt": "2024-01-01T00:01:00Z",
           "children": children})
}

fn workflow(phase: &str, nodes: Vec<Value>) -> Workflow {
    let nodes: serde_json::Map<String, Value> = nodes
        .into_iter()
        .map(|n| (n["id"].as_str().unwrap().to_owned(), n))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "wf", "namespace": "ns", "labels": {
            "workflows.argoproj.io/completed": "true",
            "workflows.argoproj.io/workflow-archiving-status": "Archived",
            "workflows.argoproj.io/phase": phase}},
        "spec": {"entrypoint": "main", "shutdown": "Terminate", "activeDeadlineSeconds": 0,
                 "arguments": {"parameters": [{"name": "a", "value": "1"}, {"name": "b", "value": "2"}]}},
        "status": {"phase": phase, "startedAt": "2024-01-01T00:00:00Z", "finishedAt": "2024-01-01T00:05:00Z",
                   "message": "child failed", "persistentVolumeClaims": [{"name": "v"}],
                   "conditions": [{"type": "PodRunning", "status": "False"},
                                  {"type": "Completed", "status": "True", "message": "m"}],
                   "nodes": nodes}
    }))
    .unwrap()
}

/// wf (DAG) -> a (Pod, Succeeded), b (Pod, Failed).
fn simple_dag() -> Workflow {
    workflow(
        "Failed",
        vec![
            node("wf", "wf", "DAG", "Failed", &["wf-a", "wf-b"]),
            node("wf-a", "wf.a", "Pod", "Succeeded", &[]),
            node("wf-b", "wf.b", "Pod", "Failed", &[]),
        ],
    )
}

fn plan(wf: &Workflow, opts: &RetryOptions) -> Plan {
    plan_retry_at(wf, opts, now()).unwrap()
}

fn v3() -> RetryOptions {
    RetryOptions {
        argo_version: ArgoVersion::V3_7,
        ..Default::default()
    }
}

fn err(wf: &Workflow, opts: &RetryOptions) -> PlanError {
    plan_retry_at(wf, opts, now()).unwrap_err()
}

fn pod(template: &str, node_name: &str) -> String {
    format!("wf-{template}-{}", pod_name::fnv1a_32(node_name.as_bytes()))
}

#[test]
fn argo_versions_parse() {
    for s in ["v4", "4", "v4.1", "4.1.4", "V4"] {
        assert_eq!(s.parse::<ArgoVersion>(), Ok(ArgoVersion::V4), "{s}");
    }
    for s in ["v3.7", "3.7", "v3.7.6"] {
        assert_eq!(s.parse::<ArgoVersion>(), Ok(ArgoVersion::V3_7), "{s}");
    }
    for s in ["v3.6", "3", "v5", ""] {
        assert!(s.parse::<ArgoVersion>().is_err(), "{s}");
    }
    assert_eq!(ArgoVersion::default(), ArgoVersion::V4);
    assert_eq!(RetryOptions::default().max_workflow_size, 1024 * 1024);
}

#[test]
fn only_failed_and_errored_workflows_retry() {
    let mut wf = simple_dag();
    for phase in ["Failed", "Error"] {
        wf.status.phase = Some(phase.into());
        assert!(plan_retry_at(&wf, &RetryOptions::default(), now()).is_ok());
    }
    for phase in ["Running", "Pending", ""] {
        wf.status.phase = Some(phase.into());
        assert_eq!(
            err(&wf, &RetryOptions::default()).to_string(),
            format!("Cannot retry a workflow in phase {phase}")
        );
    }
    wf.status.phase = Some("Succeeded".into());
    let msg =
        "To retry a succeeded workflow, set the options restartSuccessful and nodeFieldSelector";
    assert_eq!(err(&wf, &RetryOptions::default()).to_string(), msg);
    let only_flag = RetryOptions {
        restart_successful: true,
        ..Default::default()
    };
    assert_eq!(err(&wf, &only_flag).to_string(), msg);
    let both = RetryOptions {
        restart_successful: true,
        node_field_selector: "id=wf-a".into(),
        ..Default::default()
    };
    // The failed node of a succeeded workflow (continueOn) is retried too.
    assert_eq!(plan(&wf, &both).nodes_deleted, ["wf-a", "wf-b"]);
}

#[test]
fn failed_pod_is_deleted_and_its_dag_reset() {
    let p = plan(&simple_dag(), &RetryOptions::default());
    assert_eq!(p.nodes_deleted, ["wf-b"]);
    assert_eq!(p.nodes_reset, ["wf"]);
    // v4 takes the pod name's hash from the node ID.
    assert_eq!(p.pods_to_delete, ["wf-t-b"]);
    let nodes = p.workflow.status.nodes.as_ref().unwrap();
    let root = &nodes["wf"];
    assert_eq!(root.phase(), "Running");
    assert_eq!(root.started_at.as_deref(), Some(NOW));
    assert_eq!(root.finished_at, None);
    assert_eq!(root.children(), ["wf-a"], "deleted children are pruned");
    assert_eq!(
        nodes["wf-a"].phase(),
        "Succeeded",
        "succeeded siblings stay"
    );
}

#[test]
fn workflow_fields_change_as_argo_changes_them() {
    let p = plan(&simple_dag(), &RetryOptions::default());
    let wf = &p.workflow;
    let l = wf.metadata.labels.as_ref().unwrap();
    assert!(
        !l.contains_key(labels::COMPLETED) && !l.contains_key(labels::WORKFLOW_ARCHIVING_STATUS)
    );
    assert_eq!(l[labels::PHASE], "Failed", "v4 leaves the phase label");
    assert_eq!(
        wf.status.phase, None,
        "v4 sets phase Unknown, which is empty"
    );
    assert_eq!(wf.status.message, None);
    assert_eq!(wf.status.started_at.as_deref(), Some(NOW));
    assert_eq!(wf.status.finished_at, None);
    assert_eq!(wf.status.persistent_volume_claims, None);
    assert_eq!(wf.spec.shutdown, None);
    assert_eq!(
        wf.spec.active_deadline_seconds, None,
        "a terminated workflow's deadline 0 is dropped"
    );
    let conditions = wf.status.conditions.as_ref().unwrap();
    assert_eq!(conditions.len(), 2);
    assert_eq!(
        conditions[1],
        Condition {
            type_: Some("Completed".into()),
            status: Some("False".into()),
            ..Default::default()
        }
    );

    let mut other = simple_dag();
    other.spec.active_deadline_seconds = Some(60);
    other.status.conditions = None;
    let p = plan(&other, &RetryOptions::default());
    assert_eq!(p.workflow.spec.active_deadline_seconds, Some(60));
    assert_eq!(p.workflow.status.conditions.as_ref().unwrap().len(), 1);
}

#[test]
fn v3_7_sets_phase_running_and_needs_labels() {
    let p = plan(&simple_dag(), &v3());
    assert_eq!(p.workflow.status.phase.as_deref(), Some("Running"));
    assert_eq!(
        p.workflow.metadata.labels.as_ref().unwrap()[labels::PHASE],
        "Running"
    );
    let mut unlabelled = simple_dag();
    unlabelled.metadata.labels = None;
    assert!(matches!(
        err(&unlabelled, &v3()),
        PlanError::ArgoPanics { .. }
    ));
    assert!(plan_retry_at(&unlabelled, &RetryOptions::default(), now()).is_ok());
}

#[test]
fn failed_node_with_succeeded_descendant_is_kept() {
    // A failed Pod with a succeeded child (as in continueOn hooks) is no seed.
    let wf = workflow(
        "Failed",
        vec![
            node("wf", "wf", "DAG", "Failed", &["wf-a"]),
            node("wf-a", "wf.a", "Pod", "Failed", &["wf-h"]),
            node("wf-h", "wf.a.hook", "Pod", "Succeeded", &[]),
        ],
    );
    let p = plan(&wf, &RetryOptions::default());
    assert!(p.nodes_deleted.is_empty() && p.nodes_reset.is_empty() && p.pods_to_delete.is_empty());
}

/// wf (Steps) -> [0] (StepGroup) -> r (Retry, Failed|Succeeded) -> attempts.
fn retried(retry_phase: &str, second: &str) -> Workflow {
    let mut attempt0 = node("wf-r0", "wf[0].r(0)", "Pod", "Failed", &[]);
    attempt0["nodeFlag"] = json!({"retried": true});
    let mut attempt1 = node("wf-r1", "wf[0].r(1)", "Pod", second, &[]);
    attempt1["nodeFlag"] = json!({"retried": true});
    workflow(
        "Failed",
        vec![
            node("wf", "wf", "Steps", "Failed", &["wf-g"]),
            node("wf-g", "wf[0]", "StepGroup", "Failed", &["wf-r"]),
            node("wf-r", "wf[0].r", "Retry", retry_phase, &["wf-r0", "wf-r1"]),
            attempt0,
            attempt1,
        ],
    )
}

#[test]
fn retried_attempts_rerun_unless_an_attempt_succeeded() {
    let p = plan(&retried("Failed", "Failed"), &RetryOptions::default());
    assert_eq!(p.nodes_deleted, ["wf-r0", "wf-r1"]);
    assert_eq!(
        p.nodes_reset,
        ["wf", "wf-g", "wf-r"],
        "Retry, StepGroup and Steps are reset"
    );
    assert_eq!(
        p.workflow.status.nodes.as_ref().unwrap()["wf-r"].children,
        None
    );

    // The second attempt succeeded: the failed first one is left alone.
    for opts in [RetryOptions::default(), v3()] {
        let p = plan(&retried("Succeeded", "Succeeded"), &opts);
        assert!(p.nodes_deleted.is_empty(), "{:?}", opts.argo_version);
    }
}

#[test]
fn retried_node_without_retry_parent_differs_by_version() {
    let mut orphan = node("wf-x", "wf.x", "Pod", "Failed", &[]);
    orphan["nodeFlag"] = json!({"retried": true});
    let mut wf = simple_dag();
    let x: NodeStatus = serde_json::from_value(orphan).unwrap();
    wf.status
        .nodes
        .as_mut()
        .unwrap()
        .insert("wf-x".into(), Box::new(x));
    wf.status
        .nodes
        .as_mut()
        .unwrap()
        .get_mut("wf")
        .unwrap()
        .children
        .as_mut()
        .unwrap()
        .push("wf-x".into());
    // v4 checks the node itself; v3.7 takes the DAG listing it (its "parent"), whose
    // child wf-a succeeded, so wf-x is no seed.
    assert_eq!(
        plan(&wf, &RetryOptions::default()).nodes_deleted,
        ["wf-b", "wf-x"]
    );
    assert_eq!(plan(&wf, &v3()).nodes_deleted, ["wf-b"]);
    // No parent at all: v3.7 dereferences nil.
    wf.status
        .nodes
        .as_mut()
        .unwrap()
        .get_mut("wf")
        .unwrap()
        .children = Some(vec!["wf-a".into(), "wf-b".into()]);
    wf.status
        .nodes
        .as_mut()
        .unwrap()
        .get_mut("wf-x")
        .unwrap()
        .name = "wf.onExit-x".into();
    assert!(matches!(err(&wf, &v3()), PlanError::ArgoPanics { .. }));
}

#[test]
fn container_set_deletes_the_whole_pod() {
    // wf (DAG) -> p (Pod, Failed) -> main (Container, Failed), side (Container, Succeeded)
    let wf = workflow(
        "Failed",
        vec![
            node("wf", "wf", "DAG", "Failed", &["wf-p"]),
            node("wf-p", "wf.p", "Pod", "Failed", &["wf-c1", "wf-c2"]),
            node("wf-c1", "wf.p.main", "Container", "Failed", &[]),
            node("wf-c2", "wf.p.side", "Container", "Succeeded", &[]),
        ],
    );
    let p = plan(&wf, &RetryOptions::default());
    assert_eq!(p.nodes_deleted, ["wf-c1", "wf-c2", "wf-p"]);
    assert_eq!(p.nodes_reset, ["wf"]);
    assert_eq!(p.pods_to_delete, ["wf-t-p"]);
}

#[test]
fn container_without_pod_is_argos_error() {
    let wf = workflow(
        "Failed",
        vec![
            node("wf", "wf", "DAG", "Failed", &["wf-c"]),
            node("wf-c", "wf.c", "Container", "Failed", &[]),
        ],
    );
    assert_eq!(
        err(&wf, &RetryOptions::default()).to_string(),
        "was seeking node but ran out of nodes to explore"
    );
}

#[test]
fn boundaries_are_reset_up_to_the_root() {
    // wf (Steps) -> [0] -> inner (DAG, boundary wf) -> x (Pod, boundary inner)
    let mut inner = node("wf-i", "wf[0].inner", "DAG", "Failed", &["wf-x"]);
    inner["boundaryID"] = json!("wf");
    let mut x = node("wf-x", "wf[0].inner.x", "Pod", "Failed", &[]);
    x["boundaryID"] = json!("wf-i");
    let wf = workflow(
        "Failed",
        vec![
            node("wf", "wf", "Steps", "Failed", &["wf-g"]),
            node("wf-g", "wf[0]", "StepGroup", "Failed", &["wf-i"]),
            inner,
            x,
        ],
    );
    let p = plan(&wf, &RetryOptions::default());
    assert_eq!(p.nodes_reset, ["wf", "wf-g", "wf-i"]);
    assert_eq!(p.nodes_deleted, ["wf-x"]);
}

#[test]
fn on_exit_nodes_are_dropped_and_all_their_nodes_get_pod_names() {
    let mut wf = simple_dag();
    let nodes = wf.status.nodes.as_mut().unwrap();
    for n in [
        node("wf-e", "wf.onExit", "Steps", "Succeeded", &["wf-e0"]),
        node(
            "wf-e0",
            "wf.onExit[0]",
            "StepGroup",
            "Succeeded",
            &["wf-e1"],
        ),
        node("wf-e1", "wf.onExit[0].notify", "Pod", "Succeeded", &[]),
    ] {
        let n: Box<NodeStatus> = serde_json::from_value(n).unwrap();
        nodes.insert(n.id.to_string(), n);
    }
    let p = plan(&wf, &RetryOptions::default());
    assert_eq!(p.nodes_deleted, ["wf-b", "wf-e", "wf-e0", "wf-e1"]);
    // v4 takes the hash from the node ID ("e", "e0", "e1" here); every type gets a name.
    assert_eq!(p.pods_to_delete, ["wf-t-b", "wf-t-e", "wf-t-e0", "wf-t-e1"]);
}

#[test]
fn skipped_stays_skipped_and_suspend_forgets_supplied_outputs() {
    let mut suspend = node("wf-s", "wf.s", "Suspend", "Succeeded", &["wf-b"]);
    suspend["outputs"] =
        json!({"parameters": [{"name": "approve", "value": "yes", "valueFrom": {"supplied": {}}}]});
    // The failed pod hangs below the Suspend node inside a DAG that was Skipped.
    let mut skipped = node("wf-k", "wf.k", "DAG", "Skipped", &["wf-s"]);
    skipped["boundaryID"] = json!("wf");
    let wf = workflow(
        "Failed",
        vec![
            node("wf", "wf", "DAG", "Failed", &["wf-k"]),
            skipped,
            suspend,
            node("wf-b", "wf.b", "Pod", "Failed", &[]),
        ],
    );
    let p = plan(&wf, &RetryOptions::default());
    assert_eq!(p.nodes_reset, ["wf", "wf-k"]);
    let reset = p.workflow.status.nodes.as_ref().unwrap();
    assert_eq!(reset["wf-k"].phase(), "Skipped");
    assert_eq!(reset["wf-k"].started_at.as_deref(), Some(NOW));
    let nodes = wf.status.nodes.as_ref().unwrap();
    // resetPath never resets a Suspend node, but resetNode's rule is ported as is.
    let mut reset = nodes["wf-s"].clone();
    reset_node(&mut reset, NOW);
    assert_eq!(reset.phase(), "Running");
    let params = reset.outputs.unwrap().get().parameters.unwrap();
    assert_eq!(
        serde_json::to_value(&params).unwrap(),
        json!([{"name": "approve", "valueFrom": {"supplied": {}}}])
    );
}

#[test]
fn selector_restarts_matching_successful_nodes() {
    let opts = RetryOptions {
        restart_successful: true,
        node_field_selector: "displayName=wf.a".into(),
        ..Default::default()
    };
    let p = plan(&simple_dag(), &opts);
    assert_eq!(p.nodes_deleted, ["wf-a", "wf-b"]);
    assert_eq!(p.pods_to_delete, ["wf-t-a", "wf-t-b"]);
    // Without restartSuccessful the selector is not even parsed.
    let ignored = RetryOptions {
        node_field_selector: "nonsense".into(),
        ..Default::default()
    };
    assert_eq!(plan(&simple_dag(), &ignored).nodes_deleted, ["wf-b"]);
    let bad = RetryOptions {
        restart_successful: true,
        node_field_selector: "nonsense".into(),
        ..Default::default()
    };
    assert_eq!(
        err(&simple_dag(), &bad).to_string(),
        "invalid selector: 'nonsense'; can't understand 'nonsense'"
    );
    assert!(matches!(
        err(&simple_dag(), &bad),
        PlanError::BadSelector(_)
    ));
}

#[test]
fn selecting_the_root_deletes_everything() {
    let opts = RetryOptions {
        restart_successful: true,
        node_field_selector: "id=wf".into(),
        ..Default::default()
    };
    let p = plan(&simple_dag(), &opts);
    assert_eq!(p.nodes_deleted, ["wf", "wf-a", "wf-b"]);
    assert!(p.nodes_reset.is_empty());
    assert_eq!(p.workflow.status.nodes, Some(BTreeMap::new()));
}

#[test]
fn parameters_override_in_order() {
    let opts = RetryOptions {
        parameters: Some(vec!["b=9".into(), "c=x=y".into()]),
        ..Default::default()
    };
    let mut wf = simple_dag();
    wf.status.stored_workflow_spec = Some(Box::new(WorkflowSpec {
        shutdown: Some("Stop".into()),
        ..Default::default()
    }));
    let p = plan(&wf, &opts);
    let params = |spec: &WorkflowSpec| {
        let list = spec
            .arguments
            .as_ref()
            .unwrap()
            .parameters
            .as_ref()
            .unwrap();
        list.iter()
            .map(|p| format!("{}={}", p.name, p.value.as_deref().unwrap()))
            .collect::<Vec<_>>()
    };
    assert_eq!(params(&p.workflow.spec), ["b=9", "c=x=y", "a=1"]);
    let stored = p.workflow.status.stored_workflow_spec.as_ref().unwrap();
    assert_eq!(params(stored), ["b=9", "c=x=y", "a=1"]);
    assert_eq!(stored.shutdown, None);

    let bad = RetryOptions {
        parameters: Some(vec!["novalue".into()]),
        ..Default::default()
    };
    assert_eq!(
        err(&wf, &bad).to_string(),
        "expected parameter of the form: NAME=VALUE. Received: novalue"
    );
    // An empty list changes nothing.
    let empty = RetryOptions {
        parameters: Some(vec![]),
        ..Default::default()
    };
    assert_eq!(params(&plan(&wf, &empty).workflow.spec), ["a=1", "b=2"]);
}

/// wf (DAG) -> g (TaskGroup) -> ok (Pod, Succeeded), bad (Pod, Failed)
fn task_group() -> Workflow {
    workflow(
        "Failed",
        vec![
            node("wf", "wf", "DAG", "Failed", &["wf-g"]),
            node(
                "wf-g",
                "wf.fan",
                "TaskGroup",
                "Failed",
                &["wf-ok", "wf-bad"],
            ),
            node("wf-ok", "wf.fan(0:a)", "Pod", "Succeeded", &[]),
            node("wf-bad", "wf.fan(1:b)", "Pod", "Failed", &[]),
        ],
    )
}

#[test]
fn parameter_override_reruns_task_group_siblings_in_v4_only() {
    let opts = RetryOptions {
        parameters: Some(vec!["a=2".into()]),
        ..Default::default()
    };
    // v4 (#15802): the succeeded sibling is deleted too, and its pod.
    let p = plan(&task_group(), &opts);
    assert_eq!(p.nodes_deleted, ["wf-bad", "wf-ok"]);
    assert_eq!(p.nodes_reset, ["wf", "wf-g"]);
    assert_eq!(p.pods_to_delete.len(), 2);
    // v3.7 keeps it.
    let p = plan(
        &task_group(),
        &RetryOptions {
            argo_version: ArgoVersion::V3_7,
            ..opts
        },
    );
    assert_eq!(p.nodes_deleted, ["wf-bad"]);
    // Without parameters v4 keeps it as well.
    assert_eq!(
        plan(&task_group(), &RetryOptions::default()).nodes_deleted,
        ["wf-bad"]
    );
}

#[test]
fn pod_names_follow_format_and_version() {
    let mut wf = task_group();
    // v2, v4: hash from the node ID; v3.7: FNV of the node name.
    assert_eq!(
        plan(&wf, &RetryOptions::default()).pods_to_delete,
        ["wf-t-bad"]
    );
    assert_eq!(plan(&wf, &v3()).pods_to_delete, [pod("t", "wf.fan(1:b)")]);
    wf.metadata.annotations = Some([(labels::POD_NAME_FORMAT.to_owned(), "v1".to_owned())].into());
    assert_eq!(plan(&wf, &v3()).pods_to_delete, ["wf-bad"]);
}

#[test]
fn graph_faults_are_argos_errors() {
    let mut wf = simple_dag();
    wf.status
        .nodes
        .as_mut()
        .unwrap()
        .get_mut("wf")
        .unwrap()
        .children = Some(vec!["wf-a".into()]);
    assert_eq!(
        err(&wf, &RetryOptions::default()).to_string(),
        "couldn't find parent node for wf-b"
    );
    let mut wf = simple_dag();
    let nodes = wf.status.nodes.as_mut().unwrap();
    nodes.get_mut("wf-a").unwrap().children = Some(vec!["wf-gone".into()]);
    assert_eq!(
        err(&wf, &RetryOptions::default()).to_string(),
        "coudln't obtain child wf-gone"
    );
    // Below a failed node the missing child makes Argo panic first.
    let mut wf = simple_dag();
    wf.status
        .nodes
        .as_mut()
        .unwrap()
        .get_mut("wf-b")
        .unwrap()
        .children = Some(vec!["wf-gone".into()]);
    assert!(matches!(
        err(&wf, &RetryOptions::default()),
        PlanError::ArgoPanics { .. }
    ));
}

#[test]
fn cycles_are_reported_not_followed() {
    let wf = workflow(
        "Failed",
        vec![
            node("wf", "wf", "DAG", "Failed", &["wf-a"]),
            node("wf-a", "wf.a", "DAG", "Failed", &["wf-b"]),
            node("wf-b", "wf.b", "Pod", "Failed", &["wf-a"]),
        ],
    );
    // Argo recurses through the cycle below the failed pod until its stack overflows.
    assert!(matches!(
        err(&wf, &RetryOptions::default()),
        PlanError::ArgoPanics { .. }
    ));
}

#[test]
fn no_nodes_is_a_plain_reset() {
    let mut wf = simple_dag();
    wf.status.nodes = None;
    let p = plan(&wf, &RetryOptions::default());
    assert!(p.pods_to_delete.is_empty() && p.nodes_deleted.is_empty());
    assert_eq!(p.workflow.status.nodes, Some(BTreeMap::new()));
}

#[test]
fn compressed_nodes_are_read_and_written_back_when_too_large() {
    let plain = simple_dag();
    let mut packed = plain.clone();
    packed.status.compressed_nodes = Some(compress::encode_nodes(
        plain.status.nodes.as_ref().unwrap(),
        compress::Encoder::Gzip(6),
    ));
    packed.status.nodes = None;
    let from_plain = plan(&plain, &RetryOptions::default());
    let from_packed = plan(&packed, &RetryOptions::default());
    assert_eq!(
        from_packed, from_plain,
        "compressed input gives the same plan"
    );

    // A limit the plan exceeds: its nodes go back compressed.
    let size = compress::go_json_size(&from_plain.workflow, ArgoVersion::V4);
    let opts = RetryOptions {
        max_workflow_size: size - 1,
        ..Default::default()
    };
    let small = plan(&packed, &opts);
    assert_eq!(small.workflow.status.nodes, None);
    let back = compress::decode_nodes(
        small.workflow.status.compressed_nodes.as_deref().unwrap(),
        ArgoVersion::V4,
        compress::DEFAULT_MAX_NODES_SIZE,
    )
    .unwrap();
    assert_eq!(Some(back), from_plain.workflow.status.nodes);
    // A limit nothing fits under.
    let tiny = RetryOptions {
        max_workflow_size: 10,
        ..Default::default()
    };
    assert!(matches!(
        err(&packed, &tiny),
        PlanError::TooLarge { max_size: 10, .. }
    ));

    let mut corrupt = packed.clone();
    corrupt.status.compressed_nodes = Some("!!!!".into());
    assert!(matches!(
        err(&corrupt, &RetryOptions::default()),
        PlanError::CorruptCompressedNodes(_)
    ));
    let mut offloaded = plain.clone();
    offloaded.status.offload_node_status_version = Some("fnv:1".into());
    assert_eq!(
        err(&offloaded, &RetryOptions::default()).to_string(),
        "offload node status is not supported"
    );
}

#[test]
fn multi_parent_nodes_take_the_chosen_parent() {
    // wf (DAG) -> a (TaskGroup, Failed) -> c ; wf -> b (Retry, Succeeded) -> c ; c (Pod, Failed)
    let wf = workflow(
        "Failed",
        vec![
            node("wf", "wf", "DAG", "Failed", &["wf-a", "wf-b"]),
            node("wf-a", "wf.a", "TaskGroup", "Failed", &["wf-c"]),
            node("wf-b", "wf.b", "Retry", "Failed", &["wf-c"]),
            node("wf-c", "wf.c", "Pod", "Failed", &[]),
        ],
    );
    // v4's rule: the last lister in ID order (wf-b) is the parent.
    assert_eq!(
        plan(&wf, &RetryOptions::default()).nodes_reset,
        ["wf", "wf-b"]
    );
    let first = |_: &str, _: &[&str]| 0;
    let p = plan_retry_with_parents(&wf, &RetryOptions::default(), now(), &first).unwrap();
    assert_eq!(p.nodes_reset, ["wf", "wf-a"]);
}

#[test]
fn plan_serialises_camel_case() {
    let v = serde_json::to_value(plan(&simple_dag(), &RetryOptions::default())).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["workflow", "podsToDelete", "nodesDeleted", "nodesReset"]
    );
}

#[test]
fn a_workflow_given_up_plans_as_one_borrowed() {
    let wf = simple_dag();
    let moved = super::plan(wf.clone(), &v3(), now(), &last_listed).unwrap();
    assert_eq!(moved, plan(&wf, &v3()));
    assert!(plan_retry_owned(wf, &v3()).is_ok());
}
