//! Retry requests as users make them: annotations on a workflow.
//!
//! `kubectl annotate workflow NAME rewind.dev/retry="$(date +%s)" --overwrite`
//! asks for a retry; any new value is a new request. The controller records
//! the value it has finished in `rewind.dev/retry-observed`, so a restart, a
//! resync or a relist never runs a request twice and never drops one, and it
//! reports progress in `rewind.dev/retry-status`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The annotations of the user contract.
pub mod annotations {
    /// The prefix of every annotation of the contract.
    pub const PREFIX: &str = "rewind.dev/";
    /// Set to a new value to request a retry.
    pub const RETRY: &str = "rewind.dev/retry";
    /// "true" to also restart succeeded nodes matched by the selector.
    pub const RESTART_SUCCESSFUL: &str = "rewind.dev/restart-successful";
    /// Argo's node field selector, e.g. `templateName=train`.
    pub const NODE_FIELD_SELECTOR: &str = "rewind.dev/node-field-selector";
    /// A JSON list of "name=value" parameter overrides.
    pub const PARAMETERS: &str = "rewind.dev/parameters";
    /// Written by the controller: the last request token it finished.
    pub const OBSERVED: &str = "rewind.dev/retry-observed";
    /// Written by the controller: progress of the current request (JSON).
    pub const STATUS: &str = "rewind.dev/retry-status";
}

/// A retry request read from a workflow's annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryRequest {
    /// The `rewind.dev/retry` value that identifies this request (with the workflow's UID).
    pub token: String,
    pub options: RequestOptions,
}

/// The retry options of a request, as Argo's `argo retry` takes them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestOptions {
    pub restart_successful: bool,
    pub node_field_selector: String,
    pub parameters: Option<Vec<String>>,
}

/// The longest request token kept as it is: a longer `rewind.dev/retry`
/// value is answered by its digest (see [`token`]) and refused.
pub const MAX_TOKEN: usize = 253;
/// The longest node field selector a request may carry.
pub const MAX_SELECTOR: usize = 1024;
/// The most parameter overrides a request may carry, and the longest one.
pub const MAX_PARAMETERS: usize = 100;
pub const MAX_PARAMETER: usize = 4096;
/// The longest status message written: a message naming many things (pods,
/// say) names the first few; the controller's log has them all.
pub const MAX_MESSAGE: usize = 4096;
/// How a failed request's message begins when the asker may not have what it
/// asked for (Argo's own words), so a client answers it as a refusal (403).
pub const DENIED: &str = "permission denied";
/// How an archived request's message begins when its workflow is live again (Argo's own
/// words), so a client answers it as Argo's server does: AlreadyExists (409).
pub const EXISTS: &str = "Workflow already exists on cluster";
/// The most of a user's value a message repeats.
const ECHO: usize = 64;

/// A request whose options cannot be understood; nothing is deleted for it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error(
        "annotation {retry} is {length} bytes long, more than the {MAX_TOKEN} a request token may have; set a short new value, e.g. $(date +%s)",
        retry = annotations::RETRY
    )]
    TokenTooLong { length: usize },
    #[error(
        "annotation {key} must be \"true\" or \"false\", not {value:?}; fix the annotation and set a new {retry} value",
        key = annotations::RESTART_SUCCESSFUL,
        retry = annotations::RETRY
    )]
    RestartSuccessful { value: String },
    #[error(
        "annotation {key} is {length} bytes long, more than the {MAX_SELECTOR} a node field selector may have; fix the annotation and set a new {retry} value",
        key = annotations::NODE_FIELD_SELECTOR,
        retry = annotations::RETRY
    )]
    SelectorTooLong { length: usize },
    #[error(
        "annotation {key} must be a JSON list of \"name=value\" strings ({reason}); fix the annotation and set a new {retry} value",
        key = annotations::PARAMETERS,
        retry = annotations::RETRY
    )]
    Parameters { reason: String },
}

/// The request a workflow's annotations carry that the controller has not
/// finished yet, if any. `Some(Err)` is a request with bad options: it must be
/// answered (with the error) and marked observed, not retried.
pub fn pending(
    annotations: &BTreeMap<String, String>,
) -> Option<Result<RetryRequest, RequestError>> {
    let token = token(annotations)?;
    if annotations.get(annotations::OBSERVED).map(|o| o.trim()) == Some(token.as_str()) {
        return None;
    }
    let raw = annotations[annotations::RETRY].trim().len();
    if raw > MAX_TOKEN {
        return Some(Err(RequestError::TokenTooLong { length: raw }));
    }
    Some(options(annotations).map(|options| RetryRequest { token, options }))
}

/// The token of the request `annotations` carry, if any: the trimmed
/// `rewind.dev/retry` value, or for a value longer than [`MAX_TOKEN`] its
/// SHA-256 (`sha256:` and hex), which is what rewind records as observed
/// and in the status: a hostile value of hundreds of kilobytes is never
/// copied back into the object (where it would break the object's size
/// limit, and with it the answer).
pub fn token(annotations: &BTreeMap<String, String>) -> Option<String> {
    let value = annotations.get(annotations::RETRY)?.trim();
    if value.is_empty() {
        return None;
    }
    if value.len() <= MAX_TOKEN {
        return Some(value.to_owned());
    }
    use sha2::Digest;
    Some(format!(
        "sha256:{:x}",
        sha2::Sha256::digest(value.as_bytes())
    ))
}

/// `value` as a message may repeat it: its first characters.
fn echo(value: &str) -> String {
    match value.char_indices().nth(ECHO) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    }
}

/// `message` cut to [`MAX_MESSAGE`] bytes (on a character boundary, with an
/// ellipsis), for a status.
pub fn bounded(message: &str) -> String {
    if message.len() <= MAX_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_MESSAGE - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

fn options(annotations: &BTreeMap<String, String>) -> Result<RequestOptions, RequestError> {
    let restart_successful = match annotations
        .get(annotations::RESTART_SUCCESSFUL)
        .map(|v| v.trim())
    {
        None | Some("") | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(RequestError::RestartSuccessful { value: echo(other) });
        }
    };
    let node_field_selector = annotations
        .get(annotations::NODE_FIELD_SELECTOR)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    if node_field_selector.len() > MAX_SELECTOR {
        return Err(RequestError::SelectorTooLong {
            length: node_field_selector.len(),
        });
    }
    let parameters = match annotations.get(annotations::PARAMETERS).map(|p| p.trim()) {
        None | Some("") => None,
        Some(json) => Some(parse_parameters(json)?),
    };
    Ok(RequestOptions {
        restart_successful,
        node_field_selector,
        parameters,
    })
}

fn parse_parameters(json: &str) -> Result<Vec<String>, RequestError> {
    let parameters: Vec<String> =
        serde_json::from_str(json).map_err(|e| RequestError::Parameters {
            reason: e.to_string(),
        })?;
    if parameters.len() > MAX_PARAMETERS {
        return Err(RequestError::Parameters {
            reason: format!("{} of them, more than {MAX_PARAMETERS}", parameters.len()),
        });
    }
    if let Some(long) = parameters.iter().find(|p| p.len() > MAX_PARAMETER) {
        return Err(RequestError::Parameters {
            reason: format!(
                "{:?} is {} bytes, more than {MAX_PARAMETER}",
                echo(long),
                long.len()
            ),
        });
    }
    // Argo rejects a parameter without '=' too, but only after the workflow
    // is read; saying so here names the annotation the user must fix.
    if let Some(bad) = parameters.iter().find(|p| !p.contains('=')) {
        return Err(RequestError::Parameters {
            reason: format!("{:?} has no '='", echo(bad)),
        });
    }
    Ok(parameters)
}

/// The merge patch that asks for request `token` with `options`. Every option
/// annotation is written (or removed), so no option of an earlier request
/// leaks into this one.
pub fn patch(token: &str, options: &RequestOptions) -> serde_json::Value {
    let parameters = options
        .parameters
        .as_ref()
        .map(|p| serde_json::to_string(p).expect("a list of strings serializes"));
    let selector =
        (!options.node_field_selector.is_empty()).then_some(options.node_field_selector.as_str());
    serde_json::json!({"metadata": {"annotations": {
        annotations::RETRY: token,
        annotations::RESTART_SUCCESSFUL: options.restart_successful.then_some("true"),
        annotations::NODE_FIELD_SELECTOR: selector,
        annotations::PARAMETERS: parameters,
    }}})
}

/// A status timestamp, as Kubernetes writes them (RFC 3339, seconds, UTC).
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// What a WorkflowRetry's live request token starts with, before its UID.
pub const WORKFLOWRETRY_TOKEN_PREFIX: &str = "workflowretry-";

/// The `rewind.dev/retry` token of a WorkflowRetry's live request.
pub fn workflowretry_token(uid: &str) -> String {
    format!("{WORKFLOWRETRY_TOKEN_PREFIX}{uid}")
}

/// The progress `annotations` report for request `token`: `None` when they
/// report none, or report an older request.
pub fn status_of(
    annotations: &BTreeMap<String, String>,
    token: &str,
) -> Result<Option<RetryStatus>, serde_json::Error> {
    let Some(text) = annotations.get(annotations::STATUS) else {
        return Ok(None);
    };
    let status: RetryStatus = serde_json::from_str(text)?;
    Ok(Some(status).filter(|s| s.token == token))
}

/// Where a request stands, as `rewind.dev/retry-status` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum RetryPhase {
    Pending,
    DeletingPods,
    Committing,
    Succeeded,
    Failed,
}

impl RetryPhase {
    pub fn is_finished(self) -> bool {
        matches!(self, RetryPhase::Succeeded | RetryPhase::Failed)
    }
}

/// The JSON in `rewind.dev/retry-status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryStatus {
    pub token: String,
    pub phase: RetryPhase,
    pub pods_total: u64,
    pub pods_deleted: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::protocol::annotations_of as ann;

    #[test]
    fn no_request_without_token_or_when_observed() {
        assert_eq!(pending(&ann(&[])), None);
        assert_eq!(pending(&ann(&[(annotations::RETRY, " ")])), None);
        assert_eq!(
            pending(&ann(&[
                (annotations::RETRY, "1"),
                (annotations::OBSERVED, "1")
            ])),
            None
        );
    }

    #[test]
    fn new_token_is_a_request_with_options() {
        let got = pending(&ann(&[
            (annotations::RETRY, "2"),
            (annotations::OBSERVED, "1"),
            (annotations::RESTART_SUCCESSFUL, "true"),
            (annotations::NODE_FIELD_SELECTOR, "templateName=a"),
            (annotations::PARAMETERS, r#"["x=1","y=a=b"]"#),
        ]));
        assert_eq!(
            got,
            Some(Ok(RetryRequest {
                token: "2".into(),
                options: RequestOptions {
                    restart_successful: true,
                    node_field_selector: "templateName=a".into(),
                    parameters: Some(vec!["x=1".into(), "y=a=b".into()]),
                },
            }))
        );
    }

    #[test]
    fn bad_options_are_errors_naming_the_annotation() {
        let bad_bool = pending(&ann(&[
            (annotations::RETRY, "1"),
            (annotations::RESTART_SUCCESSFUL, "yes"),
        ]));
        let Some(Err(e)) = bad_bool else {
            panic!("expected an error, got {bad_bool:?}")
        };
        assert!(
            e.to_string().contains(annotations::RESTART_SUCCESSFUL),
            "{e}"
        );

        for json in ["not json", r#"{"x":"1"}"#, r#"["x"]"#] {
            let got = pending(&ann(&[
                (annotations::RETRY, "1"),
                (annotations::PARAMETERS, json),
            ]));
            assert!(
                matches!(got, Some(Err(RequestError::Parameters { .. }))),
                "{json}: {got:?}"
            );
        }
    }

    #[test]
    fn the_patch_sets_every_option_and_clears_the_unset_ones() {
        let options = RequestOptions {
            restart_successful: true,
            node_field_selector: "templateName=a".into(),
            parameters: Some(vec!["x=1".into()]),
        };
        assert_eq!(
            patch("7", &options),
            serde_json::json!({"metadata": {"annotations": {
                "rewind.dev/retry": "7",
                "rewind.dev/restart-successful": "true",
                "rewind.dev/node-field-selector": "templateName=a",
                "rewind.dev/parameters": "[\"x=1\"]",
            }}})
        );
        assert_eq!(
            patch("8", &RequestOptions::default()),
            serde_json::json!({"metadata": {"annotations": {
                "rewind.dev/retry": "8",
                "rewind.dev/restart-successful": null,
                "rewind.dev/node-field-selector": null,
                "rewind.dev/parameters": null,
            }}})
        );
    }

    #[test]
    fn the_patch_reads_back_as_the_same_request() {
        let options = RequestOptions {
            restart_successful: true,
            node_field_selector: "id=5".into(),
            parameters: Some(vec!["a=b=c".into()]),
        };
        let patch = patch("9", &options);
        let annotations: BTreeMap<String, String> = patch["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
        let got = pending(&annotations).unwrap().unwrap();
        assert_eq!((got.token.as_str(), got.options), ("9", options));
    }

    #[test]
    fn oversize_values_are_refused_and_never_copied_back_whole() {
        let long = "x".repeat(300_000);
        let Some(Err(e)) = pending(&ann(&[(annotations::RETRY, &long)])) else {
            panic!("a token of 300 kB must be refused")
        };
        assert_eq!(e, RequestError::TokenTooLong { length: 300_000 });
        // What rewind records for it is a digest, and marks it answered.
        let digest = token(&ann(&[(annotations::RETRY, &long)])).unwrap();
        assert!(
            digest.starts_with("sha256:") && digest.len() == 71,
            "{digest}"
        );
        assert_eq!(
            pending(&ann(&[
                (annotations::RETRY, &long),
                (annotations::OBSERVED, &digest)
            ])),
            None
        );
        let at_most = "y".repeat(MAX_TOKEN);
        assert_eq!(
            token(&ann(&[(annotations::RETRY, &at_most)])),
            Some(at_most)
        );

        let selector = "templateName=a,".repeat(100);
        let got = pending(&ann(&[
            (annotations::RETRY, "1"),
            (annotations::NODE_FIELD_SELECTOR, &selector),
        ]));
        assert!(
            matches!(got, Some(Err(RequestError::SelectorTooLong { .. }))),
            "{got:?}"
        );

        let many = serde_json::to_string(&vec!["a=b"; MAX_PARAMETERS + 1]).unwrap();
        let huge =
            serde_json::to_string(&vec!["a=".to_owned() + &"b".repeat(MAX_PARAMETER)]).unwrap();
        for json in [many, huge] {
            let got = pending(&ann(&[
                (annotations::RETRY, "1"),
                (annotations::PARAMETERS, &json),
            ]));
            let Some(Err(e)) = got else {
                panic!("expected an error")
            };
            assert!(e.to_string().len() < 400, "{e}");
        }
        let value = "z".repeat(10_000);
        let got = pending(&ann(&[
            (annotations::RETRY, "1"),
            (annotations::RESTART_SUCCESSFUL, &value),
        ]));
        let Some(Err(e)) = got else {
            panic!("expected an error")
        };
        assert!(
            e.to_string().len() < 400,
            "the message repeats the whole value: {}",
            e.to_string().len()
        );
    }

    #[test]
    fn a_message_is_bounded_on_a_character_boundary() {
        assert_eq!(bounded("short"), "short");
        let long = "é".repeat(MAX_MESSAGE);
        let cut = bounded(&long);
        assert!(
            cut.len() <= MAX_MESSAGE && cut.ends_with('…'),
            "{}",
            cut.len()
        );
    }

    #[test]
    fn status_json_uses_the_documented_field_names() {
        let status = RetryStatus {
            token: "1".into(),
            phase: RetryPhase::DeletingPods,
            pods_total: 10,
            pods_deleted: 3,
            message: String::new(),
            started_at: Some("2026-01-01T00:00:00Z".into()),
            finished_at: None,
        };
        assert_eq!(
            serde_json::to_string(&status).unwrap(),
            r#"{"token":"1","phase":"DeletingPods","podsTotal":10,"podsDeleted":3,"startedAt":"2026-01-01T00:00:00Z"}"#
        );
    }

    #[test]
    fn status_of_reads_only_the_asked_request() {
        let json = r#"{"token":"2","phase":"Succeeded","podsTotal":1,"podsDeleted":1}"#;
        let on = ann(&[(annotations::STATUS, json)]);
        assert_eq!(
            status_of(&on, "2").unwrap().map(|s| s.phase),
            Some(RetryPhase::Succeeded)
        );
        assert_eq!(status_of(&on, "1").unwrap(), None);
        assert_eq!(status_of(&ann(&[]), "2").unwrap(), None);
        assert!(status_of(&ann(&[(annotations::STATUS, "{")]), "2").is_err());
    }
}
