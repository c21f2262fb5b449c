//! Pod names of workflow nodes, exactly as Argo derives them
//! (`workflow/util/pod_name.go` and `Workflow.NodeID`).
//!
//! Argo never stores a pod name in the node status: every component
//! recomputes it from the workflow name, node name, template and node ID, so
//! rewind must compute the same string to delete the right pod.

use std::fmt;

use crate::argo::plan::ArgoVersion;
use crate::argo::workflow::{NodeStatus, Workflow, labels};

/// Kubernetes' limit on a resource name.
const MAX_K8S_RESOURCE_NAME_LENGTH: usize = 253;
/// Room Argo reserves for "-" and a 32-bit hash in decimal.
const K8S_NAMING_HASH_LENGTH: usize = 10;
const MAX_PREFIX_LENGTH: usize = MAX_K8S_RESOURCE_NAME_LENGTH - K8S_NAMING_HASH_LENGTH;

/// The `workflows.argoproj.io/pod-name-format` of a workflow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodNameFormat {
    /// The pod is named like its node ID.
    V1,
    /// `WORKFLOW-TEMPLATE-HASH`, Argo's default.
    #[default]
    V2,
}

impl PodNameFormat {
    /// The format the workflow's annotation names. A missing annotation means
    /// the controller's `POD_NAMES` environment, which rewind takes as unset
    /// (Argo's default, v2); an unknown value is v2 too, as in Argo.
    pub fn of(wf: &Workflow) -> Self {
        match wf.annotation(labels::POD_NAME_FORMAT) {
            Some("v1") => Self::V1,
            _ => Self::V2,
        }
    }
}

/// Argo itself panics on this node (a slice out of range in
/// `GeneratePodName`): its ID ends in a hash longer than a pod name may be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashTooLong {
    pub node_id: String,
}

impl fmt::Display for HashTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "node ID {:?} is too long to make a pod name of at most {MAX_K8S_RESOURCE_NAME_LENGTH} characters",
            self.node_id
        )
    }
}

/// 32-bit FNV-1a, Go's `hash/fnv.New32a`. Hand-written: the `fnv` crate only
/// offers the 64-bit variant.
pub fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The ID Argo gives the node named `node_name` (`Workflow.NodeID`).
pub fn node_id(workflow_name: &str, node_name: &str) -> String {
    if node_name == workflow_name {
        return workflow_name.to_owned();
    }
    format!("{workflow_name}-{}", fnv1a_32(node_name.as_bytes()))
}

/// Argo's `GeneratePodName`. The v4 line takes the hash from the node ID
/// (so nodes whose names collide under FNV-32 keep distinct pods); v3.7
/// always hashes the node name.
pub fn pod_name(
    workflow_name: &str,
    node_name: &str,
    template_name: &str,
    node_id: &str,
    format: PodNameFormat,
    version: ArgoVersion,
) -> Result<String, HashTooLong> {
    if format == PodNameFormat::V1 {
        return Ok(node_id.to_owned());
    }
    if workflow_name == node_name {
        return Ok(workflow_name.to_owned());
    }
    // Go slices strings by bytes; work on bytes and convert once at the end.
    let mut prefix = workflow_name.as_bytes().to_vec();
    if !template_name.is_empty() {
        prefix.push(b'-');
        prefix.extend_from_slice(template_name.as_bytes());
    }
    prefix.truncate(MAX_PREFIX_LENGTH - 1);

    let hash = match version {
        ArgoVersion::V4 => node_id
            .strip_prefix(workflow_name)
            .and_then(|rest| rest.strip_prefix('-')),
        ArgoVersion::V3_7 => None,
    };
    let name = match hash {
        Some(hash) => {
            let len = prefix.len() + 1 + hash.len();
            if let Some(excess) = len
                .checked_sub(MAX_K8S_RESOURCE_NAME_LENGTH)
                .filter(|&e| e > 0)
            {
                if excess > prefix.len() {
                    return Err(HashTooLong {
                        node_id: node_id.to_owned(),
                    });
                }
                prefix.truncate(prefix.len() - excess);
            }
            prefix.push(b'-');
            prefix.extend_from_slice(hash.as_bytes());
            prefix
        }
        None => {
            prefix.push(b'-');
            prefix.extend_from_slice(fnv1a_32(node_name.as_bytes()).to_string().as_bytes());
            prefix
        }
    };
    Ok(go_string(name))
}

/// The pod name of `node` in `wf`, with the node's template as Argo reads it
/// (`GetTemplateFromNode`).
pub fn node_pod_name(
    wf: &Workflow,
    node: &NodeStatus,
    version: ArgoVersion,
) -> Result<String, HashTooLong> {
    pod_name(
        wf.name(),
        &node.name,
        &node.template(),
        &node.id,
        PodNameFormat::of(wf),
        version,
    )
}

/// Bytes as Go's JSON encoder writes them: each byte that is not part of valid
/// UTF-8 becomes U+FFFD (a truncation can split a multi-byte character).
fn go_string(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => {
            let bytes = e.into_bytes();
            let mut out = String::with_capacity(bytes.len() + 2);
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                match std::str::from_utf8(rest) {
                    Ok(s) => {
                        out.push_str(s);
                        break;
                    }
                    Err(e) => {
                        let (valid, after) = rest.split_at(e.valid_up_to());
                        out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                        let bad = e.error_len().unwrap_or(after.len());
                        out.extend(std::iter::repeat_n(char::REPLACEMENT_CHARACTER, bad));
                        rest = &after[bad..];
                    }
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: ArgoVersion = ArgoVersion::V4;
    const V3: ArgoVersion = ArgoVersion::V3_7;

    #[test]
    fn fnv1a_matches_reference_vectors() {
        assert_eq!(fnv1a_32(b""), 0x811c9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9cf968);
    }

    #[test]
    fn node_ids_hash_the_name() {
        assert_eq!(node_id("wf", "wf"), "wf");
        assert_eq!(
            node_id("wf", "wf[0].a"),
            format!("wf-{}", fnv1a_32(b"wf[0].a"))
        );
    }

    // Cases from Argo's pod_name_v2_test.go / pod_name_v1_test.go.
    #[test]
    fn v1_is_the_node_id() {
        let name = pod_name("wf", "wf[0].a", "tmpl", "wf-123", PodNameFormat::V1, V4).unwrap();
        assert_eq!(name, "wf-123");
    }

    #[test]
    fn v2_joins_workflow_template_and_hash() {
        let id = node_id("wf", "wf[0].a");
        let hash = fnv1a_32(b"wf[0].a");
        for v in [V4, V3] {
            assert_eq!(
                pod_name("wf", "wf[0].a", "tmpl", &id, PodNameFormat::V2, v).unwrap(),
                format!("wf-tmpl-{hash}")
            );
            assert_eq!(
                pod_name("wf", "wf[0].a", "", &id, PodNameFormat::V2, v).unwrap(),
                format!("wf-{hash}")
            );
            assert_eq!(
                pod_name("wf", "wf", "tmpl", "wf", PodNameFormat::V2, v).unwrap(),
                "wf"
            );
        }
    }

    #[test]
    fn v4_takes_the_hash_from_the_node_id_v3_rehashes() {
        // A widened (collision) ID: v4 keeps its hash, v3.7 hashes the name.
        let name = pod_name(
            "wf",
            "wf.a",
            "t",
            "wf-18446744073709551615",
            PodNameFormat::V2,
            V4,
        )
        .unwrap();
        assert_eq!(name, "wf-t-18446744073709551615");
        let name = pod_name(
            "wf",
            "wf.a",
            "t",
            "wf-18446744073709551615",
            PodNameFormat::V2,
            V3,
        )
        .unwrap();
        assert_eq!(name, format!("wf-t-{}", fnv1a_32(b"wf.a")));
        // An ID that does not start with the workflow name: hashed in both.
        let name = pod_name("wf", "wf.a", "t", "other-1", PodNameFormat::V2, V4).unwrap();
        assert_eq!(name, format!("wf-t-{}", fnv1a_32(b"wf.a")));
    }

    #[test]
    fn long_prefixes_are_truncated_to_242_bytes() {
        let wf = "w".repeat(100);
        let tmpl = "t".repeat(200);
        let id = node_id(&wf, "n");
        for v in [V4, V3] {
            let name = pod_name(&wf, "n", &tmpl, &id, PodNameFormat::V2, v).unwrap();
            let hash = fnv1a_32(b"n").to_string();
            assert_eq!(name.len(), 242 + 1 + hash.len());
            assert!(name.ends_with(&format!("t-{hash}")));
        }
    }

    #[test]
    fn v4_shortens_the_prefix_for_wide_hashes() {
        let wf = "w".repeat(100);
        let tmpl = "t".repeat(200);
        let id = format!("{wf}-18446744073709551615");
        let name = pod_name(&wf, "n", &tmpl, &id, PodNameFormat::V2, V4).unwrap();
        assert_eq!(name.len(), 253);
        assert!(name.ends_with("t-18446744073709551615"));
    }

    #[test]
    fn v4_hash_longer_than_a_name_is_argo_panicking() {
        let id = format!("wf-{}", "9".repeat(300));
        let err = pod_name("wf", "n", "t", &id, PodNameFormat::V2, V4).unwrap_err();
        assert_eq!(err.node_id, id);
    }

    #[test]
    fn truncation_inside_a_character_writes_replacement_per_byte() {
        // 241 bytes ("w"s and "-") then a 3-byte character: the cut at 242 keeps 1 of its bytes.
        let wf = "w".repeat(240);
        let name = pod_name(&wf, "n", "€", "x", PodNameFormat::V2, V3).unwrap();
        assert_eq!(name, format!("{wf}-\u{fffd}-{}", fnv1a_32(b"n")));
        assert_eq!(go_string(vec![b'a', 0xe2, 0x82]), "a\u{fffd}\u{fffd}");
    }

    #[test]
    fn format_comes_from_the_annotation() {
        let mut wf = Workflow::default();
        assert_eq!(PodNameFormat::of(&wf), PodNameFormat::V2);
        for (value, want) in [
            ("v1", PodNameFormat::V1),
            ("v2", PodNameFormat::V2),
            ("v9", PodNameFormat::V2),
        ] {
            wf.metadata.annotations =
                Some([(labels::POD_NAME_FORMAT.to_owned(), value.to_owned())].into());
            assert_eq!(PodNameFormat::of(&wf), want);
        }
    }
}
