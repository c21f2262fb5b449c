//! What rewind adds to a refusal: Argo's message alone (what `argo retry`
//! says) often leaves a user guessing, so the answer keeps it first and then
//! says, in words, what state the workflow is in and what to do.
//!
//! Pure: it reads the error and the workflow's annotations as they were when
//! the request was refused.

use std::collections::BTreeMap;

use crate::argo::plan::PlanError;
use crate::protocol::request::{self, RequestError, RetryPhase, annotations};

/// A refusal of a request, before anything was deleted: Argo's planner
/// refused the workflow, or the request's options do not parse.
#[derive(Clone, Copy, Debug)]
pub enum Refusal<'a> {
    Plan(&'a PlanError),
    Request(&'a RequestError),
}

impl std::fmt::Display for Refusal<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Plan(e) => e.fmt(f),
            Refusal::Request(e) => e.fmt(f),
        }
    }
}

/// The message a refused request answers with: Argo's (or rewind's) message,
/// then the hint of [`explain`] when there is one.
pub fn message(
    refusal: Refusal<'_>,
    workflow: &str,
    annotations: &BTreeMap<String, String>,
) -> String {
    match explain(refusal, workflow, annotations) {
        Some(hint) => format!("{refusal} — {hint}"),
        None => refusal.to_string(),
    }
}

/// The workflow's state in words and what to do, for the refusals whose
/// message does not say it already.
pub fn explain(
    refusal: Refusal<'_>,
    workflow: &str,
    annotations: &BTreeMap<String, String>,
) -> Option<String> {
    let then_again = "then ask again with a new rewind.dev/retry value (or `rewind retry` again)";
    match refusal {
        Refusal::Plan(PlanError::PhaseNotRetryable { phase }) if phase.is_empty() => {
            Some(match last_reset(annotations) {
                Some((token, at)) => format!(
                    "not finished: it was reset by request {token} at {at} and waits for Argo's controller to run it; wait until it ends (`kubectl get workflow {workflow} -w`), {then_again}"
                ),
                None => format!(
                    "not finished: it has no phase yet, so Argo's controller has not picked it up (check that the workflow-controller runs); wait until it ends (`kubectl get workflow {workflow} -w`), {then_again}"
                ),
            })
        }
        Refusal::Plan(PlanError::PhaseNotRetryable { phase })
            if phase == "Running" || phase == "Pending" =>
        {
            Some(format!(
                "the workflow is still running and only a finished (Failed or Error) workflow can be retried; wait until it ends (`argo wait {workflow}`) or stop it (`argo stop {workflow}`), {then_again}"
            ))
        }
        Refusal::Plan(PlanError::PhaseNotRetryable { .. }) => Some(format!(
            "only a Failed or Error workflow can be retried; nothing was deleted; {then_again} once it has failed"
        )),
        Refusal::Plan(PlanError::SucceededNeedsSelector) => Some(format!(
            "nothing to retry: the workflow succeeded, so no node failed; to run some of its nodes again, ask with both options: `rewind retry {workflow} --restart-successful --node-field-selector templateName=STEP` (or the annotations {}=\"true\" and {})",
            annotations::RESTART_SUCCESSFUL,
            annotations::NODE_FIELD_SELECTOR
        )),
        Refusal::Plan(PlanError::BadSelector(_)) => Some(format!(
            "the node field selector takes comma-separated KEY=VALUE or KEY!=VALUE terms with keys name, displayName, templateName, phase, id, templateRef.name, templateRef.template or inputs.parameters.NAME.value (e.g. templateName=train); nothing was deleted; fix {} (or --node-field-selector) and {then_again}",
            annotations::NODE_FIELD_SELECTOR
        )),
        Refusal::Plan(PlanError::BadParameter { .. })
        | Refusal::Request(RequestError::Parameters { .. }) => Some(format!(
            "parameters are NAME=VALUE strings, given as a JSON list in {} (e.g. [\"epochs=3\"]) or as `rewind retry {workflow} -p epochs=3`; nothing was deleted",
            annotations::PARAMETERS
        )),
        Refusal::Plan(PlanError::TooLarge {
            compressed_size,
            max_size,
        }) => Some(format!(
            "the reset workflow is too large: {compressed_size} bytes even compressed, above the limit of {max_size} (MAX_WORKFLOW_SIZE); Argo would offload its nodes to its database, and rewind does too, but only when its --argo-configmap names Argo's persistence with nodeStatusOffLoad, which this controller's does not; nothing was deleted; configure that, retry fewer nodes with a node field selector, or raise MAX_WORKFLOW_SIZE of rewind and of Argo's controller alike"
        )),
        Refusal::Plan(PlanError::OffloadedNodes) => Some(format!(
            "the workflow's nodes are kept in Argo's offload database: rewind's controller reads them there (its --argo-configmap names Argo's persistence), but a preview here cannot; nothing was deleted; ask for the retry itself (`rewind retry {workflow}` without --dry-run)"
        )),
        _ => None,
    }
}

/// The request that last reset the workflow and when, from the annotations
/// the controller wrote with the reset.
fn last_reset(annotations: &BTreeMap<String, String>) -> Option<(String, String)> {
    let token = annotations.get(annotations::OBSERVED)?;
    let status = request::status_of(annotations, token).ok()??;
    (status.phase == RetryPhase::Succeeded).then(|| {
        (
            status.token,
            status
                .finished_at
                .unwrap_or_else(|| "an unknown time".into()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argo::plan::selector::SelectorError;

    use crate::protocol::annotations_of as ann;

    fn phase(phase: &str) -> PlanError {
        PlanError::PhaseNotRetryable {
            phase: phase.into(),
        }
    }

    #[test]
    fn an_empty_phase_after_a_reset_names_the_request_and_its_time() {
        let reset = ann(&[
            (annotations::OBSERVED, "1796235895"),
            (
                annotations::STATUS,
                r#"{"token":"1796235895","phase":"Succeeded","podsTotal":3,"podsDeleted":3,"finishedAt":"2026-12-02T18:25:22Z"}"#,
            ),
        ]);
        assert_eq!(
            message(Refusal::Plan(&phase("")), "wf", &reset),
            "Cannot retry a workflow in phase  — not finished: it was reset by request 1796235895 at 2026-12-02T18:25:22Z and waits for Argo's controller to run it; wait until it ends (`kubectl get workflow wf -w`), then ask again with a new rewind.dev/retry value (or `rewind retry` again)"
        );
    }

    #[test]
    fn an_empty_phase_without_a_reset_says_argo_has_not_picked_it_up() {
        // A status of an older request, or a failed one, is no reset.
        let failed = ann(&[
            (annotations::OBSERVED, "2"),
            (
                annotations::STATUS,
                r#"{"token":"2","phase":"Failed","podsTotal":0,"podsDeleted":0}"#,
            ),
        ]);
        for annotations in [ann(&[]), failed] {
            let text = message(Refusal::Plan(&phase("")), "wf", &annotations);
            assert!(
                text.starts_with("Cannot retry a workflow in phase  — not finished: it has no phase yet, so Argo's controller has not picked it up"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_running_workflow_says_wait_or_stop() {
        for p in ["Running", "Pending"] {
            let text = message(Refusal::Plan(&phase(p)), "wf", &ann(&[]));
            assert!(
                text.starts_with(&format!(
                    "Cannot retry a workflow in phase {p} — the workflow is still running"
                )),
                "{text}"
            );
            assert!(
                text.contains("`argo wait wf`") && text.contains("`argo stop wf`"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_succeeded_workflow_has_nothing_to_retry_and_names_both_options() {
        let text = message(
            Refusal::Plan(&PlanError::SucceededNeedsSelector),
            "wf",
            &ann(&[]),
        );
        assert!(
            text.starts_with("To retry a succeeded workflow, set the options restartSuccessful and nodeFieldSelector — nothing to retry"),
            "{text}"
        );
        assert!(
            text.contains("--restart-successful --node-field-selector"),
            "{text}"
        );
        assert!(text.contains(annotations::RESTART_SUCCESSFUL), "{text}");
    }

    #[test]
    fn a_bad_selector_explains_the_syntax() {
        let error = PlanError::BadSelector(SelectorError::NoOperator {
            selector: "oops".into(),
            term: "oops".into(),
        });
        let text = message(Refusal::Plan(&error), "wf", &ann(&[]));
        assert!(
            text.starts_with(
                "invalid selector: 'oops'; can't understand 'oops' — the node field selector takes"
            ),
            "{text}"
        );
        assert!(text.contains("templateName=train"), "{text}");
    }

    #[test]
    fn bad_parameters_show_the_form_from_either_source() {
        let plan = PlanError::BadParameter {
            parameter: "x".into(),
        };
        let request = RequestError::Parameters {
            reason: "\"x\" has no '='".into(),
        };
        for error in [Refusal::Plan(&plan), Refusal::Request(&request)] {
            let argo = error.to_string();
            let text = message(error, "wf", &ann(&[]));
            assert!(
                text.starts_with(&format!("{argo} — parameters are NAME=VALUE")),
                "{text}"
            );
            assert!(text.contains("-p epochs=3"), "{text}");
        }
    }

    #[test]
    fn too_large_gives_the_sizes_and_the_ways_out() {
        let error = PlanError::TooLarge {
            compressed_size: 2000,
            max_size: 1000,
        };
        let text = message(Refusal::Plan(&error), "wf", &ann(&[]));
        assert!(
            text.starts_with("workflow is longer than maximum allowed size"),
            "{text}"
        );
        assert!(
            text.contains(
                "2000 bytes even compressed, above the limit of 1000 (MAX_WORKFLOW_SIZE)"
            ),
            "{text}"
        );
        assert!(text.contains("node field selector"), "{text}");
    }

    #[test]
    fn messages_that_already_say_what_to_do_are_kept_as_they_are() {
        let error = RequestError::RestartSuccessful {
            value: "yes".into(),
        };
        assert_eq!(
            message(Refusal::Request(&error), "wf", &ann(&[])),
            error.to_string()
        );
        let argo_says_it = PlanError::MissingParent { node: "n".into() };
        assert_eq!(explain(Refusal::Plan(&argo_says_it), "wf", &ann(&[])), None);
    }
}
