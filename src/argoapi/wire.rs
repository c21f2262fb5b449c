//! The Argo Server's retry calls as they travel over HTTP: the request bodies
//! of `pkg/apiclient/workflow/workflow.proto` and
//! `pkg/apiclient/workflowarchive/workflow-archive.proto` (Argo v4.1.4), and
//! errors as grpc-gateway renders a gRPC status, so Argo's UI, the `argo`
//! CLI (`ARGO_HTTP1=true`) and Hera read rewind's answers as Argo's.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::protocol::request::RequestOptions;

/// `WorkflowRetryRequest` and `RetryArchivedWorkflowRequest` alike: the
/// fields both carry. grpc-gateway fills `name`, `namespace` and `uid` from
/// the path, which wins over the body; protojson accepts a field by its JSON
/// name (`restartSuccessful`) or its proto name, which these share.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RetryBody {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub restart_successful: bool,
    pub node_field_selector: String,
    /// `null` and absent alike mean none, as protojson reads a repeated field.
    pub parameters: Option<Vec<String>>,
}

impl RetryBody {
    /// The body of a call: empty is an empty message (the UI sends no body
    /// when no option is set), anything else must be the message's JSON.
    pub fn parse(bytes: &[u8]) -> Result<Self, Status> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(RetryBody::default());
        }
        serde_json::from_slice(bytes).map_err(|e| {
            Status::new(
                Code::InvalidArgument,
                format!("the request body is not a retry request's JSON: {e}"),
            )
        })
    }

    /// The options as rewind's request carries them.
    pub fn options(&self) -> RequestOptions {
        RequestOptions {
            restart_successful: self.restart_successful,
            node_field_selector: self.node_field_selector.trim().to_owned(),
            parameters: self.parameters.clone().filter(|p| !p.is_empty()),
        }
    }
}

/// The gRPC status codes Argo's server answers with (google.golang.org/grpc/codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Aborted = 10,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Code {
    /// The HTTP status grpc-gateway answers a code with (runtime.HTTPStatusFromCode).
    pub fn http(self) -> StatusCode {
        match self {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }

    /// The code Argo's `ToStatusError` gives an error the Kubernetes API
    /// answered with `http` (server/utils/errors.go), for answers that pass an
    /// API server's refusal on.
    pub fn from_http(http: u16) -> Code {
        match http {
            400 | 422 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            409 => Code::AlreadyExists,
            504 => Code::DeadlineExceeded,
            503 => Code::Unavailable,
            _ => Code::Internal,
        }
    }
}

/// A failed call, as grpc-gateway writes a gRPC status:
/// `{"code":3,"message":"...","details":[]}` with the code's HTTP status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} (gRPC code {code:?})")]
pub struct Status {
    pub code: Code,
    pub message: String,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Status {
            code,
            message: message.into(),
        }
    }
}

#[derive(Serialize)]
struct Rendered<'a> {
    code: i32,
    message: &'a str,
    details: [(); 0],
}

impl Status {
    /// This status under another HTTP status than its code's: the
    /// listener's own limits (413, 408, 503), met before a call reaches
    /// anything grpc-gateway would map, keep Argo's body so its clients
    /// print the message.
    pub fn with_http(self, http: StatusCode) -> Response {
        let body = Rendered {
            code: self.code as i32,
            message: &self.message,
            details: [],
        };
        (http, Json(body)).into_response()
    }
}

/// So a handler answering [`Response`]s can pass a status on with `?`.
impl From<Status> for Response {
    fn from(status: Status) -> Self {
        status.into_response()
    }
}

impl IntoResponse for Status {
    /// Unavailable says when to come back: every one of rewind's is a
    /// moment's trouble (a full listener, a spent review budget, an API
    /// server away).
    fn into_response(self) -> Response {
        let (http, code) = (self.code.http(), self.code);
        let mut response = self.with_http(http);
        if code == Code::Unavailable {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_parse_as_argos_clients_send_them() {
        // The CLI's http1 facade marshals the whole message; the UI sends the options only.
        let cli = br#"{"name":"wf","namespace":"argo","restartSuccessful":true,"nodeFieldSelector":"templateName=a","parameters":["x=1"]}"#;
        let body = RetryBody::parse(cli).unwrap();
        assert_eq!(
            body.options(),
            RequestOptions {
                restart_successful: true,
                node_field_selector: "templateName=a".into(),
                parameters: Some(vec!["x=1".into()]),
            }
        );
        assert_eq!(body.namespace, "argo");
        for empty in [
            &b""[..],
            b"  ",
            b"{}",
            br#"{"parameters":null}"#,
            br#"{"parameters":[]}"#,
        ] {
            assert_eq!(
                RetryBody::parse(empty).unwrap().options(),
                RequestOptions::default()
            );
        }
        let archived = RetryBody::parse(br#"{"uid":"u-1","namespace":"argo"}"#).unwrap();
        assert_eq!(
            (archived.uid.as_str(), archived.namespace.as_str()),
            ("u-1", "argo")
        );
        let bad = RetryBody::parse(b"{\"restartSuccessful\":\"yes\"}").unwrap_err();
        assert_eq!(bad.code, Code::InvalidArgument);
        assert!(
            bad.message
                .starts_with("the request body is not a retry request's JSON"),
            "{}",
            bad.message
        );
    }

    #[tokio::test]
    async fn a_status_renders_as_grpc_gateway_does() {
        let response = Status::new(Code::PermissionDenied, "permission denied").into_response();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let bytes = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
            serde_json::json!({"code": 7, "message": "permission denied", "details": []})
        );
        assert_eq!(Code::Unauthenticated.http(), StatusCode::UNAUTHORIZED);
        let busy = Status::new(Code::Unavailable, "later").into_response();
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(busy.headers()[axum::http::header::RETRY_AFTER], "1");
        assert_eq!(Code::from_http(404), Code::NotFound);
        assert_eq!(Code::from_http(422), Code::InvalidArgument);
        assert_eq!(Code::from_http(500), Code::Internal);
    }
}
