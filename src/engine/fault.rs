//! What a failed Kubernetes API request means for the request that sent it:
//! the one rule for "transient" (try again later) that every flow applies,
//! and what to tell the user when it is not.

/// The HTTP status of an error the API server answered with.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Whether a later attempt may succeed: throttling (429), the server's
/// trouble (5xx), the network. Everything else — a refusal (403), a missing
/// object (404), an invalid request (422), a request that cannot be built or
/// an answer that cannot be read — stays until someone changes something, so
/// retrying it would only spin: the request ends with the error.
pub fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// What to do about an error that is not transient, for the user's message;
/// `None` when the API server's own words say it all.
pub fn advice(e: &kube::Error) -> Option<&'static str> {
    match api_code(e)? {
        // The server's message names the user, the verb, the resource and the namespace.
        403 => Some(
            "rewind's ServiceAccount lacks this permission: grant it in the controller's ClusterRole (the chart's rbac), then ask again",
        ),
        422 => Some("the API server refused the request as invalid"),
        _ => None,
    }
}

/// `e` as the user reads it: the server's own words and code (not the
/// whole debug form kube prints), then [`advice`] if any.
pub fn explain(e: &kube::Error) -> String {
    let said = match e {
        kube::Error::Api(s) if !s.message.is_empty() => {
            format!("{} ({} {})", s.message, s.code, s.reason)
        }
        _ => e.to_string(),
    };
    match advice(e) {
        Some(advice) => format!("{said}; {advice}"),
        None => said,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("pods is forbidden: User \"system:serviceaccount:rewind:rewind\" cannot delete resource \"pods\" in API group \"\" in the namespace \"ns\"", "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn throttling_and_server_trouble_pass_refusals_stay() {
        for code in [429, 500, 503, 504] {
            assert!(is_transient(&status(code)), "{code}");
        }
        for code in [400, 403, 404, 409, 422] {
            assert!(!is_transient(&status(code)), "{code}");
        }
    }

    #[test]
    fn a_refusal_names_the_permission_and_what_to_do() {
        let text = explain(&status(403));
        assert!(text.contains("cannot delete resource \"pods\""), "{text}");
        assert!(
            text.contains("grant it in the controller's ClusterRole"),
            "{text}"
        );
        assert!(text.ends_with("(403 Forbidden); rewind's ServiceAccount lacks this permission: grant it in the controller's ClusterRole (the chart's rbac), then ask again"), "{text}");
        assert!(!text.contains("Status {"), "{text}");
        assert!(!explain(&status(500)).contains("grant"));
    }
}
