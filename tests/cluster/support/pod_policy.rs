//! The admission policy that lets rewind's controller change a pod only by removing
//! Argo's finalizer (the chart's templates/pod-policy.yaml), seen from its user.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use rewind::argo::workflow::labels;
use serde_json::{Value, json};

/// Part of every refusal by the policy.
pub const REFUSAL: &str = "may change a pod only by removing Argo's finalizer";
/// How long a new policy may take to be in force.
const TAKES_EFFECT: Duration = Duration::from_secs(30);

/// A patch that adds a label, which the policy refuses.
pub fn add_label() -> Patch<Value> {
    Patch::Merge(json!({"metadata": {"labels": {"example.com/stolen": "token"}}}))
}

/// The patch the controller sends to release a pod (src/engine/workers.rs): Argo's
/// finalizer at `index`, on the pod of `uid` only.
pub fn release(uid: &str, index: usize) -> Patch<Value> {
    let path = format!("/metadata/finalizers/{index}");
    let patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": path, "value": labels::POD_STATUS_FINALIZER},
        {"op": "remove", "path": path},
    ]))
    .expect("a well-formed JSON patch");
    Patch::Json(patch)
}

/// The message of the policy's refusal; an error for anything else.
fn refusal(result: Result<Pod, kube::Error>) -> anyhow::Result<String> {
    match result {
        Err(kube::Error::Api(status))
            if status.code == 403 && status.message.contains("ValidatingAdmissionPolicy") =>
        {
            Ok(status.message)
        }
        Err(other) => bail!("expected the pod policy's 403, got {other}"),
        Ok(_) => bail!("the patch was admitted"),
    }
}

/// Sends `patch` to pod `name` in server-side dry runs (nothing is stored) until the
/// policy refuses it (a new policy takes a moment to be in force), then for real:
/// refused too, with the policy's words and `says`.
pub async fn ensure_refused(
    pods: &Api<Pod>,
    name: &str,
    patch: &Patch<Value>,
    says: &str,
) -> anyhow::Result<()> {
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = Instant::now() + TAKES_EFFECT;
    while let Err(error) = refusal(pods.patch(name, &dry_run, patch).await) {
        if Instant::now() >= deadline {
            return Err(error.context(format!(
                "patching pod {name} {patch:?}: still not refused after {TAKES_EFFECT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let message = refusal(pods.patch(name, &PatchParams::default(), patch).await)?;
    ensure!(
        message.contains(REFUSAL) && message.contains(says),
        "the refusal of {patch:?} does not say {REFUSAL:?} and {says:?}: {message}"
    );
    Ok(())
}
