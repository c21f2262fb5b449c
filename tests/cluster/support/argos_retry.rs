//! What Argo's own retry makes of a workflow (Argo's server code, run by the v4 oracle), to
//! hold rewind's result against.

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use rewind::argo::workflow::Workflow;

// Argo's retry code as an oracle, shared with the planner's differential test.
#[allow(dead_code)]
#[path = "../../support/oracle.rs"]
mod oracle;

/// Checks that `created` is what Argo's own retry makes of `row` (its server's hydrate,
/// `FormulateRetryWorkflow` and dehydrate, run by the v4 oracle; for an archived retry the
/// UID and resourceVersion are then cleared), apart from what the API server sets, rewind's
/// annotations, Go's empty values (`omitempty`), and the times each sets to "now" (both
/// after `from`).
pub async fn ensure_what_argo_creates(
    created: &Workflow,
    row: &Workflow,
    from: Timestamp,
) -> anyhow::Result<()> {
    let case = oracle::OracleCase {
        id: "archived".into(),
        workflow: serde_json::to_value(row)?,
        restart_successful: false,
        node_field_selector: String::new(),
        parameters: None,
        max_workflow_size: None,
        ..Default::default()
    };
    let result =
        tokio::task::spawn_blocking(move || oracle::run_oracle(oracle::ArgoLine::V4, &[case]))
            .await?
            .pop()
            .context("the oracle answers each case")?;
    let to = Timestamp::now() + SignedDuration::from_secs(1);
    let mut argo = match (result.workflow, result.error) {
        (Some(workflow), None) => workflow,
        (_, error) => bail!("Argo's retry of the archived row failed: {error:?}"),
    };
    let mut ours = serde_json::to_value(created)?;
    for value in [&mut ours, &mut argo] {
        let meta = value["metadata"]
            .as_object_mut()
            .context("a workflow has metadata")?;
        for set_by_server in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generation",
            "managedFields",
        ] {
            meta.remove(set_by_server);
        }
        if let Some(annotations) = meta
            .get_mut("annotations")
            .and_then(serde_json::Value::as_object_mut)
        {
            annotations.retain(|k, _| !k.starts_with("rewind.dev/"));
        }
        prune_empty(value);
    }
    let mut differences = Vec::new();
    differ(&ours, &argo, (from, to), "", &mut differences);
    ensure!(
        differences.is_empty(),
        "the created workflow differs from Argo's archived retry at {} places: {:?}",
        differences.len(),
        differences.iter().take(10).collect::<Vec<_>>()
    );
    Ok(())
}

/// Removes nulls, empty strings, objects and lists: Go omits them or writes them as its zero
/// values (e.g. a container's `name: ""`).
fn prune_empty(value: &mut serde_json::Value) {
    use serde_json::Value;
    let empty = |v: &Value| {
        v.is_null()
            || v.as_str() == Some("")
            || v.as_object().is_some_and(|o| o.is_empty())
            || v.as_array().is_some_and(|a| a.is_empty())
    };
    match value {
        Value::Object(map) => {
            map.values_mut().for_each(prune_empty);
            map.retain(|_, v| !empty(v));
        }
        Value::Array(items) => items.iter_mut().for_each(prune_empty),
        _ => {}
    }
}

/// Where `a` and `b` differ, but for two times both within `window`.
fn differ(
    a: &serde_json::Value,
    b: &serde_json::Value,
    window: (Timestamp, Timestamp),
    path: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                match (x.get(k), y.get(k)) {
                    (Some(xv), Some(yv)) => differ(xv, yv, window, &format!("{path}/{k}"), out),
                    (xv, yv) => out.push(format!("{path}/{k}: rewind {xv:?}, Argo {yv:?}")),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (xv, yv)) in x.iter().zip(y).enumerate() {
                differ(xv, yv, window, &format!("{path}/{i}"), out);
            }
        }
        (Value::String(x), Value::String(y)) if x != y => {
            let now = |s: &str| {
                s.parse::<Timestamp>()
                    .is_ok_and(|t| t >= window.0 && t <= window.1)
            };
            if !(now(x) && now(y)) {
                out.push(format!("{path}: rewind {x:?}, Argo {y:?}"));
            }
        }
        (x, y) if x != y => out.push(format!("{path}: rewind {x}, Argo {y}")),
        _ => {}
    }
}
