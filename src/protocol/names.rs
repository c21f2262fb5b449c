//! The syntax Kubernetes gives the names a request carries, checked before
//! anything is asked of the cluster with them: a name that is no name must
//! not reach a URL (`a%3Fx=1` would become a query) or a review.
//! The same syntax as the WorkflowRetry CRD's patterns (`crd.rs`).

/// A namespace: a DNS-1123 label (at most 63 characters).
pub fn is_namespace(s: &str) -> bool {
    s.len() <= 63 && is_label(s)
}

/// A workflow's name: a DNS-1123 subdomain (at most 253 characters).
pub fn is_name(s: &str) -> bool {
    s.len() <= 253
        && s.split('.')
            .all(|label| label.len() <= 63 && is_label(label))
}

/// A Kubernetes UID as Argo's archive keys workflows: a lowercase UUID.
pub fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn is_label(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|&b| alnum(b) || b == b'-')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_1123() {
        for good in ["a", "wf-1", "my.wf-2.x", &"a".repeat(63)] {
            assert!(is_name(good), "{good}");
        }
        for bad in [
            "",
            "A",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a\0",
            "a?x=1",
            "a/b",
            "ä",
            &"a".repeat(64),
            &format!("{}.{}", "a".repeat(200), "b".repeat(60)),
        ] {
            assert!(!is_name(bad), "{bad:?}");
        }
        assert!(is_namespace("team-a"));
        for bad in ["team.a", "", &"n".repeat(64), "Team"] {
            assert!(!is_namespace(bad), "{bad:?}");
        }
    }

    #[test]
    fn uids_are_lowercase_uuids() {
        assert!(is_uid("0a1b2c3d-0000-4111-8222-123456789abc"));
        for bad in [
            "",
            "0A1B2C3D-0000-4111-8222-123456789ABC",
            "0a1b2c3d-0000-4111-8222-123456789ab",
            "0a1b2c3d00004111822212345678-9abc",
            "0a1b2c3d-0000-4111-8222-123456789abg",
            "../0000-4111-8222-123456789abc",
        ] {
            assert!(!is_uid(bad), "{bad:?}");
        }
    }
}
