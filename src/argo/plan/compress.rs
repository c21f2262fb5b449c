//! `status.compressedNodes`: Argo's packer and hydrator
//! (`workflow/packer`, `workflow/hydrator`, `util/file`) as the Argo server
//! runs them around a retry.
//!
//! Reading detects the algorithm as Argo v4.1 does: zstd and gzip by their
//! magic bytes, anything else is taken as brotli; v3.7 reads gzip only.
//! Writing follows the cluster's [`Compression`] settings (Argo's
//! `WORKFLOW_COMPRESSION_ALGORITHM`, `WORKFLOW_COMPRESSION_LEVEL`,
//! `GZIP_IMPLEMENTATION`).
//!
//! Argo's bytes are not reproduced: its gzip comes from klauspost/pgzip or
//! Go's compress/flate, its zstd from klauspost/compress and its brotli from
//! andybalholm/brotli, and no Rust crate chooses the same matches (the
//! brotli crate agrees with andybalholm's at qualities 5-8 on small inputs
//! only). So the size Argo compares with the limit is not known exactly, and
//! near the limit rewind climbs an [`escalation`] of stronger encoders before
//! it refuses: it writes the first result that fits. Measured on Argo-like
//! node maps (3.2 MB and 190 KB of JSON; Argo's Go encoders at every level
//! against the Rust ones), the last step of the ladder is smaller than
//! Argo's output at any level of the same algorithm for gzip (libdeflate 12:
//! at least 6.9% below Go's best, pgzip or compress/gzip level 9) and zstd
//! (level 19: at least 13.2% below klauspost's SpeedBestCompression). Brotli
//! is the exception:
//! at Argo's quality 11 the brotli crate's quality 11 came out 0.03% larger
//! (172,650 against 172,600 bytes; 11,010 against 11,009), so in that band
//! alone, with WORKFLOW_COMPRESSION_LEVEL 11, rewind can refuse what Argo
//! writes; at qualities up to 10 the last step is 8.5% smaller. At the
//! configured level the worst measured excess over Argo's own output is 3.7%
//! (zstd level 4 against libzstd 11).

use std::io::{Read, Write};
use std::str::FromStr;

use base64::Engine;
use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use thiserror::Error;

use crate::argo::plan::ArgoVersion;
use crate::argo::workflow::{Workflow, WorkflowStatus};

/// Argo's default `MAX_WORKFLOW_SIZE`.
pub const DEFAULT_MAX_WORKFLOW_SIZE: usize = 1024 * 1024;

const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];

/// Go's `base64.StdEncoding`: padded, but lenient about the unused bits of
/// the last symbol.
const GO_STD_ENCODING: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

pub use crate::argo::workflow::Nodes;

/// Why `status.compressedNodes` cannot be read, in Go's words where Go's are
/// deterministic: base64 errors, gzip's header, truncation and checksum
/// errors, JSON syntax errors and a top level that is not an object. A
/// corrupt deflate, zstd or brotli stream and a node field of the wrong type
/// are worded by the Rust decoders (Go names a decoder-specific offset or a
/// Go type path there).
#[derive(Debug, Error)]
pub enum CompressError {
    #[error("illegal base64 data at input byte {offset}")]
    Base64 { offset: usize },
    #[error("failed to decompress: {0}")]
    Decompress(String),
    /// Argo returns gzip's body errors unwrapped (`io.ReadAll`).
    #[error("{0}")]
    Inflate(String),
    #[error("{0}")]
    Json(String),
    /// Past the cap: a decompression bomb, or a workflow larger than any
    /// Argo compresses (its compressed nodes must fit etcd's 1.5 MiB).
    #[error(
        "the workflow's compressedNodes inflate to more than {limit} bytes, rewind's limit (--max-nodes-size); nothing was deleted; if the workflow is genuine, raise the controller's memory limit to 3 × its nodes plus 64 MiB (--max-nodes-size follows it unless set; if set, raise it too)"
    )]
    TooLarge { limit: usize },
}

impl From<base64::DecodeError> for CompressError {
    fn from(e: base64::DecodeError) -> Self {
        use base64::DecodeError::*;
        let offset = match e {
            InvalidByte(offset, _) | InvalidLastSymbol { offset, .. } => offset,
            InvalidLength(len) => len,
            InvalidPadding => 0,
        };
        Self::Base64 { offset }
    }
}

/// Which compression a blob uses, by Argo's detection rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Algorithm {
    #[default]
    Gzip,
    Zstd,
    Brotli,
}

impl FromStr for Algorithm {
    type Err = std::convert::Infallible;

    /// `WORKFLOW_COMPRESSION_ALGORITHM`: "zstd", "brotli", else gzip (Argo
    /// logs a warning for an unknown name and uses gzip).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "zstd" => Self::Zstd,
            "brotli" => Self::Brotli,
            "gzip" | "" => Self::Gzip,
            other => {
                tracing::warn!(
                    algorithm = other,
                    "unknown WORKFLOW_COMPRESSION_ALGORITHM, Argo uses gzip"
                );
                Self::Gzip
            }
        })
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Gzip => "gzip",
            Self::Zstd => "zstd",
            Self::Brotli => "brotli",
        })
    }
}

/// Argo's `GZIP_IMPLEMENTATION`: which Go gzip writes (and reads) the nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GzipImplementation {
    /// klauspost/pgzip, Argo's default.
    #[default]
    PGZip,
    /// Go's compress/gzip.
    GZip,
}

impl FromStr for GzipImplementation {
    type Err = std::convert::Infallible;

    /// "GZip" selects Go's compress/gzip; any other value is pgzip, as in Argo.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(if s == "GZip" { Self::GZip } else { Self::PGZip })
    }
}

impl std::fmt::Display for GzipImplementation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::PGZip => "PGZip",
            Self::GZip => "GZip",
        })
    }
}

/// How the cluster's Argo compresses nodes: `WORKFLOW_COMPRESSION_ALGORITHM`,
/// `WORKFLOW_COMPRESSION_LEVEL` (kept as given: Argo falls back to the
/// algorithm's default for a value that is not a number in range) and
/// `GZIP_IMPLEMENTATION`. v3.7 knows gzip only.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Compression {
    pub algorithm: Algorithm,
    pub level: Option<String>,
    pub gzip_implementation: GzipImplementation,
}

impl Compression {
    /// The encoders rewind tries in turn where Argo of `version` compresses
    /// with these settings: v3.7 writes gzip at the default level whatever
    /// the algorithm and level say.
    pub fn encoders(&self, version: ArgoVersion) -> Vec<Encoder> {
        match version {
            ArgoVersion::V4 => escalation(self.algorithm, self.level_for(self.algorithm)),
            ArgoVersion::V3_7 => escalation(Algorithm::Gzip, 6),
        }
    }

    /// `compressionLevel`: the level if it parses and is in the algorithm's
    /// range, else its default (gzip 1-9, default 6; zstd 1-4, default 2;
    /// brotli 0-11, default 6).
    pub fn level_for(&self, algorithm: Algorithm) -> u32 {
        let (default, min, max) = match algorithm {
            Algorithm::Gzip => (6, 1, 9),
            Algorithm::Zstd => (2, 1, 4),
            Algorithm::Brotli => (6, 0, 11),
        };
        let Some(given) = self.level.as_deref().filter(|l| !l.is_empty()) else {
            return default;
        };
        match given.parse::<i64>() {
            Ok(l) if (min..=max).contains(&l) => l as u32,
            _ => {
                tracing::warn!(
                    level = given,
                    %algorithm,
                    "invalid WORKFLOW_COMPRESSION_LEVEL, Argo uses the algorithm's default"
                );
                default
            }
        }
    }
}

/// One encoder setting of an [`escalation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoder {
    /// libdeflate at this level (1-12), gzip framing.
    Gzip(i32),
    /// libzstd at this level.
    Zstd(i32),
    /// The brotli crate at this quality and window (log2).
    Brotli(u32, u32),
}

/// The encoders to try in turn for `algorithm` at Argo's `level`: first the
/// one closest to Argo's, then stronger ones, for a result that only fits
/// the limit when it is as small as Argo's. (A brotli window of 2^24 instead
/// of Argo's 2^22 gave nothing at quality 11 and took twice as long.)
pub fn escalation(algorithm: Algorithm, level: u32) -> Vec<Encoder> {
    match algorithm {
        Algorithm::Gzip => {
            let mut steps = vec![Encoder::Gzip(level as i32)];
            steps.extend(
                [9, 12]
                    .into_iter()
                    .filter(|&l| l > level as i32)
                    .map(Encoder::Gzip),
            );
            steps
        }
        Algorithm::Zstd => {
            // klauspost's SpeedFastest..SpeedBestCompression are meant to be
            // about libzstd's levels 1, 3, 7-8 and 11.
            let first = [1, 3, 7, 11][level.clamp(1, 4) as usize - 1];
            let mut steps = vec![Encoder::Zstd(first)];
            steps.extend(
                [15, 19]
                    .into_iter()
                    .filter(|&l| l > first)
                    .map(Encoder::Zstd),
            );
            steps
        }
        Algorithm::Brotli => {
            let mut steps = vec![Encoder::Brotli(level, 22)];
            steps.extend(
                [9, 10, 11]
                    .into_iter()
                    .filter(|&q| q > level)
                    .map(|q| Encoder::Brotli(q, 22)),
            );
            steps
        }
    }
}

/// Compresses `data` with one encoder. Compressing into memory cannot fail.
pub fn compress_with(encoder: Encoder, data: &[u8]) -> Vec<u8> {
    match encoder {
        Encoder::Gzip(level) => {
            let level = libdeflater::CompressionLvl::new(level)
                .unwrap_or_else(|_| libdeflater::CompressionLvl::default());
            let mut c = libdeflater::Compressor::new(level);
            let mut out = vec![0; c.gzip_compress_bound(data.len())];
            let n = c.gzip_compress(data, &mut out).unwrap_or_default();
            out.truncate(n);
            out
        }
        Encoder::Zstd(level) => zstd::bulk::compress(data, level).unwrap_or_default(),
        Encoder::Brotli(quality, lgwin) => {
            let mut out = Vec::with_capacity(data.len() / 4);
            let mut w = brotli::CompressorWriter::new(&mut out, 64 * 1024, quality, lgwin);
            let _ = w.write_all(data);
            drop(w);
            out
        }
    }
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

/// The most bytes rewind inflates `compressedNodes` to by default. Argo
/// compresses nodes only to fit the workflow into etcd (1.5 MiB, its
/// MAX_WORKFLOW_SIZE 1 MiB by default) and offloads them when still too
/// large; node JSON compresses about tenfold (2.7 MB to 278 kB for 8,000
/// pods of the test workload), so genuine nodes stay near 10-20 MiB. The
/// cap leaves them room and stops a decompression bomb (a megabyte of gzip
/// can inflate to a gigabyte) long before it exhausts memory.
pub const DEFAULT_MAX_NODES_SIZE: usize = 64 << 20;

/// `file.DecodeDecompressString` followed by the JSON decode of
/// `packer.DecompressWorkflow`. JSON `null` is an empty map, as in Go.
/// Inflating past `limit` bytes is an error ([`CompressError::TooLarge`]).
pub fn decode_nodes(
    compressed: &str,
    version: ArgoVersion,
    limit: usize,
) -> Result<Nodes, CompressError> {
    // Go's StdEncoding skips line breaks inside the data.
    let cleaned: Vec<u8> = compressed
        .bytes()
        .filter(|b| !matches!(b, b'\r' | b'\n'))
        .collect();
    let raw = GO_STD_ENCODING.decode(cleaned)?;
    if let Some(nodes) = decode_streamed(&raw, version, limit) {
        return Ok(nodes);
    }
    // Only a failure needs the whole text: for Go's own message.
    let json = match version {
        ArgoVersion::V4 => decompress(&raw, limit)?,
        ArgoVersion::V3_7 => gunzip(&raw, limit)?,
    };
    match serde_json::from_slice::<Option<Nodes>>(&json) {
        Ok(nodes) => Ok(nodes.unwrap_or_default()),
        Err(e) => Err(CompressError::Json(go_json_error(&json, e))),
    }
}

/// The nodes read as they inflate, never holding their JSON beside them (for
/// 20,000 rich nodes, 18 MiB); `None` on any failure, which [`decode_nodes`]
/// words as Go would.
fn decode_streamed(raw: &[u8], version: ArgoVersion, limit: usize) -> Option<Nodes> {
    let algorithm = Algorithm::detect(raw);
    if version == ArgoVersion::V3_7 && algorithm != Algorithm::Gzip {
        return None;
    }
    let mut limited = decoder(raw, algorithm)
        .ok()?
        .take((limit as u64).saturating_add(1));
    let nodes = serde_json::from_reader::<_, Option<Nodes>>(std::io::BufReader::with_capacity(
        64 * 1024,
        &mut limited,
    ))
    .ok()?;
    // At the limit the JSON may go on past what was read: refuse it as too large.
    (limited.limit() > 0).then(|| nodes.unwrap_or_default())
}

/// The reader of `content`'s inflated bytes.
fn decoder(content: &[u8], algorithm: Algorithm) -> std::io::Result<Box<dyn Read + '_>> {
    Ok(match algorithm {
        Algorithm::Zstd => Box::new(zstd::stream::read::Decoder::new(content)?),
        Algorithm::Gzip => Box::new(flate2::read::MultiGzDecoder::new(content)),
        Algorithm::Brotli => Box::new(brotli::Decompressor::new(content, 64 * 1024)),
    })
}

/// v4's `file.DecompressContent`, stopping past `limit` bytes.
pub fn decompress(content: &[u8], limit: usize) -> Result<Vec<u8>, CompressError> {
    let failed = |e: std::io::Error| CompressError::Decompress(e.to_string());
    match Algorithm::detect(content) {
        Algorithm::Gzip => gunzip(content, limit),
        algorithm => {
            let decoder = decoder(content, algorithm).map_err(failed)?;
            inflate(decoder, content.len(), limit, failed)
        }
    }
}

/// Reads `decoder` to its end, or fails with [`CompressError::TooLarge`]
/// once it yields more than `limit` bytes; a read error is worded by `word`.
fn inflate(
    decoder: impl Read,
    compressed: usize,
    limit: usize,
    word: impl FnOnce(std::io::Error) -> CompressError,
) -> Result<Vec<u8>, CompressError> {
    let mut out = Vec::with_capacity(compressed.saturating_mul(8).min(limit));
    decoder
        .take(limit.saturating_add(1) as u64)
        .read_to_end(&mut out)
        .map_err(word)?;
    if out.len() > limit {
        return Err(CompressError::TooLarge { limit });
    }
    Ok(out)
}

/// Gzip, with Go's messages for a missing or wrong header, a truncated
/// stream and a wrong checksum; past `limit` bytes, an error.
fn gunzip(content: &[u8], limit: usize) -> Result<Vec<u8>, CompressError> {
    if content.is_empty() {
        return Err(CompressError::Decompress("EOF".into()));
    }
    // Go reads the 10-byte header whole before it looks at it.
    if content.len() < 10 {
        return Err(CompressError::Decompress("unexpected EOF".into()));
    }
    if !content.starts_with(GZIP_MAGIC) || content.get(2).is_some_and(|&cm| cm != 8) {
        return Err(CompressError::Decompress("gzip: invalid header".into()));
    }
    let word = |e: std::io::Error| {
        CompressError::Inflate(match e.kind() {
            std::io::ErrorKind::UnexpectedEof => "unexpected EOF".into(),
            _ if e.to_string().contains("checksum") => "gzip: invalid checksum".into(),
            _ => format!("flate: corrupt input: {e}"),
        })
    };
    let decoder = decoder(content, Algorithm::Gzip).map_err(word)?;
    inflate(decoder, content.len(), limit, word)
}

/// Go's `json.Unmarshal` message for a node map that failed to decode, where
/// it does not depend on Go's types: Go checks the whole document's syntax
/// first, then unmarshals into `v1alpha1.Nodes`.
fn go_json_error(json: &[u8], typed: serde_json::Error) -> String {
    let syntax = serde_json::from_slice::<serde::de::IgnoredAny>(json).err();
    let Some(e) = syntax else {
        let kind = match json.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'[') => "array",
            Some(b'"') => "string",
            Some(b't' | b'f') => "bool",
            Some(b'-' | b'0'..=b'9') => "number",
            _ => return typed.to_string(),
        };
        return format!("json: cannot unmarshal {kind} into Go value of type v1alpha1.Nodes");
    };
    if e.is_eof() {
        return "unexpected end of JSON input".into();
    }
    let text = e.to_string();
    let what = text.split(" at line ").next().unwrap_or_default();
    // serde's line and column (1-based, in bytes) point at the offending byte.
    let offset = json
        .split_inclusive(|&b| b == b'\n')
        .take(e.line().saturating_sub(1))
        .map(<[u8]>::len)
        .sum::<usize>()
        + e.column().saturating_sub(1);
    let Some(&c) = json.get(offset) else {
        return text;
    };
    let context = match what {
        "expected value" => "looking for beginning of value",
        "key must be a string" => "looking for beginning of object key string",
        "trailing comma" if c == b'}' => "looking for beginning of object key string",
        "trailing comma" => "looking for beginning of value",
        "expected `:`" => "after object key",
        "expected `,` or `}`" => "after object key:value pair",
        "expected `,` or `]`" => "after array element",
        "trailing characters" => "after top-level value",
        _ => return text,
    };
    format!("invalid character {} {context}", go_quote_char(c))
}

/// Go's `quoteChar` for the byte `encoding/json` names in a syntax error.
fn go_quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".into(),
        b'"' => r#"'"'"#.into(),
        b'\n' => r"'\n'".into(),
        b'\r' => r"'\r'".into(),
        b'\t' => r"'\t'".into(),
        0x20..=0x7e => format!("'{}'", c as char),
        _ => format!("'\\x{c:02x}'"),
    }
}

/// `file.CompressEncodeString` of the nodes' JSON with one encoder.
pub fn encode_nodes(nodes: &Nodes, encoder: Encoder) -> String {
    let json = serde_json::to_vec(nodes).unwrap_or_default();
    STANDARD.encode(compress_with(encoder, &json))
}

/// The `compressedNodes` Argo's hydrator decodes: only when `nodes` is
/// empty. With both set, Argo works on `nodes` and keeps the stale blob.
pub fn blob_to_hydrate(status: &WorkflowStatus) -> Option<&str> {
    let has_nodes = status.nodes.as_ref().is_some_and(|n| !n.is_empty());
    status
        .compressed_nodes
        .as_deref()
        .filter(|c| !c.is_empty() && !has_nodes)
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
///
/// Argo compresses once with its setting; rewind tries the encoders of
/// [`escalation`] in turn and keeps the first result that fits, so it never
/// refuses what Argo writes (see the module's measurements). The stronger
/// steps are slow (seconds per MB), so they are tried only when the first
/// result is over the limit by less than a tenth of its compressed nodes,
/// well above the largest measured gap to Argo's output (3.7%).
pub fn dehydrate(
    wf: &mut Workflow,
    max_size: usize,
    compression: &Compression,
    version: ArgoVersion,
) -> Result<(), TooLarge> {
    let hydrated = wf
        .status
        .compressed_nodes
        .as_deref()
        .unwrap_or_default()
        .is_empty()
        && wf
            .status
            .offload_node_status_version
            .as_deref()
            .unwrap_or_default()
            .is_empty();
    if !hydrated || go_json_size(wf, version) <= max_size {
        return Ok(());
    }
    let nodes = wf.status.nodes.take().unwrap_or_default();
    let json = serde_json::to_vec(&nodes).unwrap_or_default();
    let mut first_size = None;
    for encoder in compression.encoders(version) {
        wf.status.compressed_nodes = Some(STANDARD.encode(compress_with(encoder, &json)));
        let size = go_json_size(wf, version);
        if size <= max_size {
            if first_size.is_some() {
                tracing::info!(
                    workflow = wf.metadata.name.as_deref().unwrap_or_default(),
                    ?encoder,
                    size,
                    max_size,
                    "compressed harder to fit Argo's size limit"
                );
            }
            return Ok(());
        }
        let first = *first_size.get_or_insert(size);
        let blob = wf.status.compressed_nodes.as_deref().map_or(0, str::len);
        if first - max_size > blob / 10 {
            break;
        }
    }
    wf.status.compressed_nodes = None;
    wf.status.nodes = Some(nodes);
    Err(TooLarge {
        compressed_size: first_size.unwrap_or_default(),
        max_size,
    })
}

/// The length of Go's `json.Marshal` of the workflow, which Argo compares to
/// the size limit. Serde writes the same JSON apart from: Go's HTML escaping
/// of `<`, `>`, `&` (6 bytes each) and U+2028/U+2029, and the zero
/// `metav1.Time` and struct fields Go always writes (`creationTimestamp`,
/// `startedAt`, `finishedAt` as `null`, `spec.arguments` as `{}`; v3.7's
/// apimachinery also writes a zero `creationTimestamp` as `null`, in the
/// workflow's and the volume claim templates' metadata, where v4's omits it),
/// and the empty maps Go's `omitempty` leaves out (labels, annotations,
/// nodes). Other fields of the spec that Go would re-encode differently are
/// not modelled; the differential test checks this size against Go's on
/// every case.
pub fn go_json_size(wf: &Workflow, version: ArgoVersion) -> usize {
    let mut counter = GoSizeCounter::default();
    // Counting cannot fail, and the types serialise.
    let _ = serde_json::to_writer(&mut counter, wf);
    let mut size = counter.size;
    // `"key":null` plus a separating comma (every object involved has other fields).
    let null_field = |key: &str| key.len() + 2 + 1 + 4 + 1;
    if version == ArgoVersion::V3_7 {
        if wf.metadata.creation_timestamp.is_none() {
            size += null_field("creationTimestamp");
        }
        let specs = std::iter::once(&wf.spec).chain(wf.status.stored_workflow_spec.as_deref());
        let templates: Vec<serde_json::Value> = specs
            .filter_map(|s| s.other.get("volumeClaimTemplates"))
            .map(|t| t.to_value())
            .collect();
        for template in templates
            .iter()
            .filter_map(serde_json::Value::as_array)
            .flatten()
        {
            match template
                .get("metadata")
                .and_then(serde_json::Value::as_object)
            {
                Some(m) if m.contains_key("creationTimestamp") => {}
                Some(m) if m.is_empty() => size += null_field("creationTimestamp") - 1,
                Some(_) => size += null_field("creationTimestamp"),
                None => size += r#""metadata":{"creationTimestamp":null},"#.len(),
            }
        }
    }
    // Serde writes these maps when empty; Go's `omitempty` leaves them out.
    if wf.metadata.labels.as_ref().is_some_and(|l| l.is_empty()) {
        size -= r#""labels":{},"#.len();
    }
    if wf
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.is_empty())
    {
        size -= r#""annotations":{},"#.len();
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
    if status.nodes.as_ref().is_some_and(|n| n.is_empty()) {
        size -= r#""nodes":{},"#.len();
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

/// Counts the bytes Go would write for what serde writes, without keeping
/// them: each `<`, `>`, `&` becomes 6 bytes, U+2028 and U+2029 too. Serde
/// writes a multi-byte character within one chunk, so chunks are scanned alone.
#[derive(Default)]
struct GoSizeCounter {
    size: usize,
}

impl Write for GoSizeCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.size += buf.len();
        for (i, &b) in buf.iter().enumerate() {
            match b {
                b'<' | b'>' | b'&' => self.size += 5,
                0xe2 if matches!(buf.get(i + 1..i + 3), Some([0x80, 0xa8 | 0xa9])) => {
                    self.size += 3
                }
                _ => {}
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argo::workflow::NodeStatus;

    const V4: ArgoVersion = ArgoVersion::V4;
    const V3: ArgoVersion = ArgoVersion::V3_7;

    fn nodes() -> Nodes {
        let node = NodeStatus {
            id: "wf".into(),
            name: "wf".into(),
            type_: "DAG".into(),
            ..Default::default()
        };
        [("wf".to_owned(), Box::new(node))].into()
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
                brotli::CompressorWriter::new(&mut out, 4096, 6, 22)
                    .write_all(json)
                    .unwrap();
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
            assert_eq!(
                decode_nodes(&encode_with(algorithm, &json), V4, DEFAULT_MAX_NODES_SIZE).unwrap(),
                nodes(),
                "{algorithm:?}"
            );
        }
        // v3.7 reads gzip only.
        assert_eq!(
            decode_nodes(
                &encode_with(Algorithm::Gzip, &json),
                V3,
                DEFAULT_MAX_NODES_SIZE
            )
            .unwrap(),
            nodes()
        );
        for algorithm in [Algorithm::Zstd, Algorithm::Brotli] {
            let err = decode_nodes(&encode_with(algorithm, &json), V3, DEFAULT_MAX_NODES_SIZE)
                .unwrap_err();
            assert_eq!(
                err.to_string(),
                "failed to decompress: gzip: invalid header"
            );
        }
    }

    #[test]
    fn inflating_past_the_limit_stops_there() {
        // Whitespace is valid JSON padding and compresses a thousandfold.
        let bomb = vec![b' '; 4 << 20];
        for algorithm in [Algorithm::Gzip, Algorithm::Zstd, Algorithm::Brotli] {
            let blob = encode_with(algorithm, &bomb);
            assert!(blob.len() < 64 << 10, "{algorithm:?}: {}", blob.len());
            let err = decode_nodes(&blob, V4, 1 << 20).unwrap_err();
            assert!(
                matches!(err, CompressError::TooLarge { limit } if limit == 1 << 20),
                "{algorithm:?}: {err}"
            );
            assert!(err.to_string().contains("--max-nodes-size"), "{err}");
            // At the limit exactly, it is read (and is no node map).
            let err = decode_nodes(&blob, V4, 4 << 20).unwrap_err();
            assert!(
                matches!(err, CompressError::Json(_)),
                "{algorithm:?}: {err}"
            );
        }
        let err = decode_nodes(&encode_with(Algorithm::Gzip, &bomb), V3, 1 << 20).unwrap_err();
        assert!(matches!(err, CompressError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn nodes_at_the_limit_exactly_are_read_and_a_byte_over_are_not() {
        let json = serde_json::to_vec(&many_nodes()).unwrap();
        for algorithm in [Algorithm::Gzip, Algorithm::Zstd, Algorithm::Brotli] {
            let blob = encode_with(algorithm, &json);
            assert_eq!(
                decode_nodes(&blob, V4, json.len()).unwrap(),
                many_nodes(),
                "{algorithm:?}"
            );
            let err = decode_nodes(&blob, V4, json.len() - 1).unwrap_err();
            assert!(
                matches!(err, CompressError::TooLarge { .. }),
                "{algorithm:?}: {err}"
            );
        }
    }

    #[test]
    fn round_trips_and_ignores_line_breaks() {
        let encoded = encode_nodes(&nodes(), Encoder::Gzip(6));
        let wrapped: String = encoded
            .chars()
            .enumerate()
            .flat_map(|(i, c)| (i % 10 == 9).then_some('\n').into_iter().chain([c]))
            .collect();
        assert_eq!(
            decode_nodes(&wrapped, V4, DEFAULT_MAX_NODES_SIZE).unwrap(),
            nodes()
        );
        assert_eq!(
            decode_nodes(
                &encode_with(Algorithm::Gzip, b"null"),
                V4,
                DEFAULT_MAX_NODES_SIZE
            )
            .unwrap(),
            Nodes::new()
        );
    }

    #[test]
    fn corrupt_input_is_an_error() {
        assert_eq!(
            decode_nodes("ab%%", V4, DEFAULT_MAX_NODES_SIZE)
                .unwrap_err()
                .to_string(),
            "illegal base64 data at input byte 2"
        );
        assert_eq!(
            decode_nodes(
                &STANDARD.encode([0x1f, 0x8b, 0, 0]),
                V4,
                DEFAULT_MAX_NODES_SIZE
            )
            .unwrap_err()
            .to_string(),
            "failed to decompress: unexpected EOF"
        );
        assert!(matches!(
            decode_nodes(
                &STANDARD.encode([0x1f, 0x8b, 8, 0]),
                V4,
                DEFAULT_MAX_NODES_SIZE
            ),
            Err(CompressError::Decompress(_))
        ));
        assert_eq!(
            decode_nodes(
                &encode_with(Algorithm::Zstd, b"[1]"),
                V4,
                DEFAULT_MAX_NODES_SIZE
            )
            .unwrap_err()
            .to_string(),
            "json: cannot unmarshal array into Go value of type v1alpha1.Nodes"
        );
    }

    #[test]
    fn hydrates_only_without_plain_nodes() {
        let mut status = WorkflowStatus {
            compressed_nodes: Some("blob".into()),
            ..Default::default()
        };
        assert_eq!(blob_to_hydrate(&status), Some("blob"));
        status.nodes = Some(Nodes::new());
        assert_eq!(blob_to_hydrate(&status), Some("blob"));
        status.nodes = Some(nodes());
        assert_eq!(blob_to_hydrate(&status), None);
        status.compressed_nodes = Some(String::new());
        status.nodes = None;
        assert_eq!(blob_to_hydrate(&status), None);
    }

    #[test]
    fn dehydrate_compresses_only_when_too_large() {
        // Enough alike nodes for gzip to make them smaller.
        let many: Nodes = (0..50)
            .map(|i| {
                let id = format!("wf-{i}");
                (
                    id.clone(),
                    Box::new(NodeStatus {
                        id: id.into(),
                        name: format!("wf.step-{i}").into(),
                        type_: "Pod".into(),
                        ..Default::default()
                    }),
                )
            })
            .collect();
        let mut wf = Workflow::default();
        wf.status.nodes = Some(many.clone());
        let size = go_json_size(&wf, V4);
        dehydrate(&mut wf, size, &Compression::default(), V4).unwrap();
        assert!(wf.status.compressed_nodes.is_none());
        dehydrate(&mut wf, size - 1, &Compression::default(), V4).unwrap();
        assert!(wf.status.nodes.is_none());
        assert_eq!(
            decode_nodes(
                wf.status.compressed_nodes.as_deref().unwrap(),
                V4,
                DEFAULT_MAX_NODES_SIZE
            )
            .unwrap(),
            many
        );
    }

    #[test]
    fn dehydrate_leaves_a_workflow_that_stays_too_large() {
        let mut wf = Workflow::default();
        wf.status.nodes = Some(nodes());
        let err = dehydrate(&mut wf, 10, &Compression::default(), V4).unwrap_err();
        assert_eq!(err.max_size, 10);
        assert!(err.compressed_size > 10);
        assert_eq!(wf.status.nodes, Some(nodes()));
        assert!(wf.status.compressed_nodes.is_none());
    }

    #[test]
    fn go_size_counts_what_go_writes() {
        let mut wf = Workflow {
            api_version: "v".into(),
            kind: "k".into(),
            ..Default::default()
        };
        wf.metadata.name = Some("a<b".into());
        wf.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        wf.spec.arguments = Some(Default::default());
        wf.status.started_at = Some("x".into());
        wf.status.finished_at = Some("y".into());
        let go = r#"{"apiVersion":"v","kind":"k","metadata":{"name":"a\u003cb","creationTimestamp":"1970-01-01T00:00:00Z"},"spec":{"arguments":{}},"status":{"startedAt":"x","finishedAt":"y"}}"#;
        assert_eq!(go_json_size(&wf, V3), go.len());
        wf.status.finished_at = None;
        let go = go.replace(r#""finishedAt":"y""#, r#""finishedAt":null"#);
        assert_eq!(go_json_size(&wf, V3), go.len());
    }

    #[test]
    fn settings_fall_back_as_argo_does() {
        let with = |algorithm: Algorithm, level: Option<&str>| Compression {
            algorithm,
            level: level.map(String::from),
            ..Default::default()
        };
        assert_eq!("zstd".parse::<Algorithm>().unwrap(), Algorithm::Zstd);
        assert_eq!("lz4".parse::<Algorithm>().unwrap(), Algorithm::Gzip);
        assert_eq!(
            "GZip".parse::<GzipImplementation>().unwrap(),
            GzipImplementation::GZip
        );
        assert_eq!(
            "gzip".parse::<GzipImplementation>().unwrap(),
            GzipImplementation::PGZip
        );
        assert_eq!(with(Algorithm::Gzip, None).level_for(Algorithm::Gzip), 6);
        assert_eq!(
            with(Algorithm::Gzip, Some("9")).level_for(Algorithm::Gzip),
            9
        );
        assert_eq!(
            with(Algorithm::Gzip, Some("0")).level_for(Algorithm::Gzip),
            6
        );
        assert_eq!(
            with(Algorithm::Zstd, Some("5")).level_for(Algorithm::Zstd),
            2
        );
        assert_eq!(
            with(Algorithm::Brotli, Some("0")).level_for(Algorithm::Brotli),
            0
        );
        assert_eq!(
            with(Algorithm::Brotli, Some("x")).level_for(Algorithm::Brotli),
            6
        );
        // v3.7 writes gzip at its default level whatever the settings say.
        assert_eq!(
            with(Algorithm::Zstd, Some("1")).encoders(V3)[0],
            Encoder::Gzip(6)
        );
        assert_eq!(
            with(Algorithm::Zstd, Some("1")).encoders(V4)[0],
            Encoder::Zstd(1)
        );
    }

    fn many_nodes() -> Nodes {
        (0..200)
            .map(|i| {
                let id = format!("wf-{}", i * 7919 % 10007);
                (
                    id.clone(),
                    Box::new(NodeStatus {
                        id: id.into(),
                        name: format!("wf.step-{i}({})", i * 31 % 97).into(),
                        type_: "Pod".into(),
                        message: Some(format!("exit code {}", i % 3).into()),
                        ..Default::default()
                    }),
                )
            })
            .collect()
    }

    #[test]
    fn near_the_limit_a_stronger_encoder_is_tried_before_refusing() {
        for compression in [
            Compression::default(),
            Compression {
                algorithm: Algorithm::Zstd,
                ..Default::default()
            },
            Compression {
                algorithm: Algorithm::Brotli,
                level: Some("5".into()),
                ..Default::default()
            },
        ] {
            let mut wf = Workflow::default();
            wf.status.nodes = Some(many_nodes());
            let json = serde_json::to_vec(&many_nodes()).unwrap();
            let steps = compression.encoders(V4);
            let first = compress_with(steps[0], &json).len();
            let last = compress_with(*steps.last().unwrap(), &json).len();
            assert!(last < first, "{compression:?}: {last} >= {first}");
            let base64_len = |n: usize| n.div_ceil(3) * 4;
            // A limit the first encoder misses by a few bytes.
            let mut probe = wf.clone();
            probe.status.compressed_nodes = Some(STANDARD.encode(compress_with(steps[0], &json)));
            probe.status.nodes = None;
            let max = go_json_size(&probe, V4) - 4;
            dehydrate(&mut wf, max, &compression, V4).unwrap();
            assert!(wf.status.nodes.is_none(), "{compression:?}");
            assert_eq!(
                decode_nodes(
                    wf.status.compressed_nodes.as_deref().unwrap(),
                    V4,
                    DEFAULT_MAX_NODES_SIZE
                )
                .unwrap(),
                many_nodes()
            );
            assert!(go_json_size(&wf, V4) <= max);
            // Below what the strongest encoder reaches: refused with the first size.
            let max = go_json_size(&probe, V4) - base64_len(first) + base64_len(last) - 1;
            let mut wf = Workflow::default();
            wf.status.nodes = Some(many_nodes());
            let err = dehydrate(&mut wf, max, &compression, V4).unwrap_err();
            assert_eq!(err.compressed_size, go_json_size(&probe, V4));
            assert!(wf.status.compressed_nodes.is_none());
        }
    }

    #[test]
    fn go_omits_empty_maps_and_v4_a_zero_creation_timestamp() {
        let mut wf = Workflow {
            api_version: "v".into(),
            kind: "k".into(),
            ..Default::default()
        };
        wf.metadata.name = Some("a".into());
        wf.metadata.labels = Some(Default::default());
        wf.spec.arguments = Some(Default::default());
        wf.status.started_at = Some("x".into());
        wf.status.nodes = Some(Nodes::new());
        let v4 = r#"{"apiVersion":"v","kind":"k","metadata":{"name":"a"},"spec":{"arguments":{}},"status":{"startedAt":"x","finishedAt":null}}"#;
        assert_eq!(go_json_size(&wf, V4), v4.len());
        let v3 = v4.replace(r#""name":"a""#, r#""name":"a","creationTimestamp":null"#);
        assert_eq!(go_json_size(&wf, V3), v3.len());
    }
}
