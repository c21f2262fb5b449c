//! `status.compressedNodes`: Argo's packer and hydrator
//! (`workflow/packer`, `workflow/hydrator`, `util/file`) as the Argo server
//! runs them around a retry.
//!
//! Reading detects the algorithm as Argo v4.1 does: zstd and gzip by their
//! magic bytes, anything else is taken as brotli. Writing uses gzip, Argo's
//! default `WORKFLOW_COMPRESSION_ALGORITHM`.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use thiserror::Error;

use crate::workflow::{NodeStatus, Workflow};

/// Argo's default `MAX_WORKFLOW_SIZE`.
pub const DEFAULT_MAX_WORKFLOW_SIZE: usize = 1024 * 1024;

const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];

/// The node map of a workflow status.
pub type Nodes = BTreeMap<String, NodeStatus>;

#[derive(Debug, Error)]
pub enum CompressError {
    #[error("illegal base64 data in status.compressedNodes: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("failed to decompress: {0}")]
    Decompress(std::io::Error),
    #[error("status.compressedNodes does not hold a node map: {0}")]
    Json(#[from] serde_json::Error),
}

/// Which compression a blob uses, by Argo's detection rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    Gzip,
    Zstd,
    Brotli,
}

impl Algorithm {
    pub fn detect(content: &[u8]) -> Self {
        if content.starts_with(ZSTD_MAGIC) {
            Self::Zstd
        } else if content.starts_with(GZIP_MAGIC) {
            Self::Gzip
        } else {
            Self::Brotli
        }
    }
}

/// `file.DecodeDecompressString` followed by the JSON decode of
/// `packer.DecompressWorkflow`. JSON `null` is an empty map, as in Go.
pub fn decode_nodes(compressed: &str) -> Result<Nodes, CompressError> {
    // Go's StdEncoding skips line breaks inside the data.
    let cleaned: Vec<u8> = compressed.bytes().filter(|b| !matches!(b, b'\r' | b'\n')).collect();
    let raw = STANDARD.decode(cleaned)?;
    let json = decompress(&raw).map_err(CompressError::Decompress)?;
    let nodes: Option<Nodes> = serde_json::from_slice(&json)?;
    Ok(nodes.unwrap_or_default())
}

/// `file.DecompressContent`.
pub fn decompress(content: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(content.len() * 8);
    match Algorithm::detect(content) {
        Algorithm::Zstd => return zstd::stream::decode_all(content),
        Algorithm::Gzip => flate2::read::MultiGzDecoder::new(content).read_to_end(&mut out)?,
        Algorithm::Brotli => brotli::Decompressor::new(content, 64 * 1024).read_to_end(&mut out)?,
    };
    Ok(out)
}

/// `file.CompressEncodeString` of the nodes' JSON, with gzip at level 6.
pub fn encode_nodes(nodes: &Nodes) -> String {
    let json = serde_json::to_vec(nodes).unwrap_or_default();
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(json.len() / 4), flate2::Compression::new(6));
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(&json);
    STANDARD.encode(gz.finish().unwrap_or_default())
}

/// Hydrate's first step: nodes come from `compressedNodes` when `nodes` is
/// empty. When both are set Argo keeps both, and so does this.
pub fn hydrate(wf: &mut Workflow) -> Result<(), CompressError> {
    let status = &mut wf.status;
    let has_nodes = status.nodes.as_ref().is_some_and(|n| !n.is_empty());
    match status.compressed_nodes.as_deref() {
        Some(c) if !c.is_empty() && !has_nodes => {
            let nodes = decode_nodes(c);
            // Argo clears the field before it reports a JSON error.
            status.compressed_nodes = None;
            status.nodes = Some(nodes?);
        }
        _ => {}
    }
    Ok(())
}

/// Why the retried workflow cannot be stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooLarge {
    pub compressed_size: usize,
    pub max_size: usize,
}

/// Dehydrate without offloading (rewind has no offload database): when the
/// workflow's JSON is over `max_size`, its nodes are moved to
/// `compressedNodes`; if it is still too large, nothing changes and the error
/// says so. Skipped, as in Argo, when the workflow is not hydrated.
pub fn dehydrate(wf: &mut Workflow, max_size: usize) -> Result<(), TooLarge> {
    let hydrated = wf.status.compressed_nodes.as_deref().unwrap_or_default().is_empty()
        && wf.status.offload_node_status_version.as_deref().unwrap_or_default().is_empty();
    if !hydrated || go_json_size(wf) <= max_size {
        return Ok(());
    }
    let nodes = wf.status.nodes.take().unwrap_or_default();
    wf.status.compressed_nodes = Some(encode_nodes(&nodes));
    let compressed_size = go_json_size(wf);
    if compressed_size > max_size {
        wf.status.compressed_nodes = None;
        wf.status.nodes = Some(nodes);
        return Err(TooLarge { compressed_size, max_size });
    }
    Ok(())
}

/// The length of Go's `json.Marshal` of the workflow, which Argo compares to
/// the size limit. Serde writes the same JSON apart from: Go's HTML escaping
/// of `<`, `>`, `&` (6 bytes each) and U+2028/U+2029, and the zero
/// `metav1.Time` and struct fields Go always writes (`creationTimestamp`,
/// `startedAt`, `finishedAt` as `null`, `spec.arguments` as `{}`). Fields of
/// the spec that Go would re-encode differently are not modelled, so a
/// workflow within a few bytes of the limit may be judged differently.
pub fn go_json_size(wf: &Workflow) -> usize {
    let json = serde_json::to_vec(wf).unwrap_or_default();
    let mut size = json.len();
    size += json.iter().filter(|&&b| matches!(b, b'<' | b'>' | b'&')).count() * 5;
    size += json.windows(3).filter(|w| matches!(w, [0xe2, 0x80, 0xa8 | 0xa9])).count() * 3;
    // `"key":null` plus a separating comma (every object involved has other fields).
    let null_field = |key: &str| key.len() + 2 + 1 + 4 + 1;
    if wf.metadata.creation_timestamp.is_none() {
        size += null_field("creationTimestamp");
    }
    if wf.spec.arguments.is_none() {
        size += r#""arguments":{},"#.len();
    }
    let status = &wf.status;
    if status.started_at.is_none() {
        size += null_field("startedAt");
    }
    if status.finished_at.is_none() {
        size += null_field("finishedAt");
    }
    if status == &Default::default() {
        // Serde skips an empty status; Go writes `"status":{...}` without a comma.
        size += r#","status":{}"#.len() - 1;
    }
    for node in status.nodes.iter().flat_map(|n| n.values()) {
        if node.started_at.is_none() {
            size += null_field("startedAt");
        }
        if node.finished_at.is_none() {
            size += null_field("finishedAt");
        }
    }
    size
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Nodes {
        let node = NodeStatus { id: "wf".into(), name: "wf".into(), type_: "DAG".into(), ..Default::default() };
        [("wf".to_owned(), node)].into()
    }

    fn encode_with(algorithm: Algorithm, json: &[u8]) -> String {
        let raw = match algorithm {
            Algorithm::Gzip => {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(json).unwrap();
                gz.finish().unwrap()
            }
            Algorithm::Zstd => zstd::stream::encode_all(json, 2).unwrap(),
            Algorithm::Brotli => {
                let mut out = Vec::new();
                brotli::CompressorWriter::new(&mut out, 4096, 6, 22).write_all(json).unwrap();
                out
            }
        };
        assert_eq!(Algorithm::detect(&raw), algorithm);
        STANDARD.encode(raw)
    }

    #[test]
    fn decodes_every_algorithm_argo_writes() {
        let json = serde_json::to_vec(&nodes()).unwrap();
        for algorithm in [Algorithm::Gzip, Algorithm::Zstd, Algorithm::Brotli] {
            assert_eq!(decode_nodes(&encode_with(algorithm, &json)).unwrap(), nodes(), "{algorithm:?}");
        }
    }

    #[test]
    fn round_trips_and_ignores_line_breaks() {
        let encoded = encode_nodes(&nodes());
        let wrapped: String = encoded.chars().enumerate().flat_map(|(i, c)| (i % 10 == 9).then_some('\n').into_iter().chain([c])).collect();
        assert_eq!(decode_nodes(&wrapped).unwrap(), nodes());
        assert_eq!(decode_nodes(&encode_with(Algorithm::Gzip, b"null")).unwrap(), Nodes::new());
    }

    #[test]
    fn corrupt_input_is_an_error() {
        assert!(matches!(decode_nodes("%%%"), Err(CompressError::Base64(_))));
        assert!(matches!(decode_nodes(&STANDARD.encode([0x1f, 0x8b, 0, 0])), Err(CompressError::Decompress(_))));
        assert!(matches!(decode_nodes(&encode_with(Algorithm::Zstd, b"[1]")), Err(CompressError::Json(_))));
    }

    #[test]
    fn hydrate_prefers_plain_nodes() {
        let mut wf = Workflow::default();
        wf.status.compressed_nodes = Some(encode_nodes(&nodes()));
        hydrate(&mut wf).unwrap();
        assert_eq!(wf.status.nodes, Some(nodes()));
        assert_eq!(wf.status.compressed_nodes, None);

        let mut other = nodes();
        other.get_mut("wf").unwrap().phase = Some("Failed".into());
        wf.status.compressed_nodes = Some(encode_nodes(&other));
        hydrate(&mut wf).unwrap();
        assert_eq!(wf.status.nodes, Some(nodes()), "plain nodes win");
        assert!(wf.status.compressed_nodes.is_some(), "and the stale blob stays");
    }

    #[test]
    fn dehydrate_compresses_only_when_too_large() {
        // Enough alike nodes for gzip to make them smaller.
        let many: Nodes = (0..50)
            .map(|i| {
                let id = format!("wf-{i}");
                (id.clone(), NodeStatus { id, name: format!("wf.step-{i}"), type_: "Pod".into(), ..Default::default() })
            })
            .collect();
        let mut wf = Workflow::default();
        wf.status.nodes = Some(many.clone());
        let size = go_json_size(&wf);
        dehydrate(&mut wf, size).unwrap();
        assert!(wf.status.compressed_nodes.is_none());
        dehydrate(&mut wf, size - 1).unwrap();
        assert!(wf.status.nodes.is_none());
        assert_eq!(decode_nodes(wf.status.compressed_nodes.as_deref().unwrap()).unwrap(), many);
    }

    #[test]
    fn dehydrate_leaves_a_workflow_that_stays_too_large() {
        let mut wf = Workflow::default();
        wf.status.nodes = Some(nodes());
        let err = dehydrate(&mut wf, 10).unwrap_err();
        assert_eq!(err.max_size, 10);
        assert!(err.compressed_size > 10);
        assert_eq!(wf.status.nodes, Some(nodes()));
        assert!(wf.status.compressed_nodes.is_none());
    }

    #[test]
    fn go_size_counts_what_go_writes() {
        let mut wf = Workflow { api_version: "v".into(), kind: "k".into(), ..Default::default() };
        wf.metadata.name = Some("a<b".into());
        wf.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        wf.spec.arguments = Some(Default::default());
        wf.status.started_at = Some("x".into());
        wf.status.finished_at = Some("y".into());
        let go = r#"{"apiVersion":"v","kind":"k","metadata":{"name":"a\u003cb","creationTimestamp":"1970-01-01T00:00:00Z"},"spec":{"arguments":{}},"status":{"startedAt":"x","finishedAt":"y"}}"#;
        assert_eq!(go_json_size(&wf), go.len());
        wf.status.finished_at = None;
        let go = go.replace(r#""finishedAt":"y""#, r#""finishedAt":null"#);
        assert_eq!(go_json_size(&wf), go.len());
    }
}
