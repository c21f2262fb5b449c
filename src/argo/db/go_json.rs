//! The bytes Go's `json.Marshal(wfv1.Nodes)` writes, and the offload version
//! Argo derives from them (`persist/sqldb/offload_node_status_repo.go`
//! `nodeStatusVersion`: "fnv:" + FNV-32 of those bytes).
//!
//! Argo keys offloaded node status by that version, so rewind must write the
//! same bytes to agree with Argo about "the same nodes". Go writes map keys
//! sorted, struct fields in declaration order (omitting empty `omitempty`
//! fields, writing zero values of the others), and escapes `<`, `>`, `&`,
//! U+2028 and U+2029 in strings. The struct tables below are v4.1.4's
//! `pkg/apis/workflow/v1alpha1` types that rewind reads or writes inside a
//! node; objects nested deeper keep the order they were read in (Go wrote
//! them). Fields Go does not know are kept, after the known ones, so nothing
//! a newer Argo wrote is lost.
//!
//! Limit: nodes read from PostgreSQL's jsonb or MySQL's JSON type (not
//! MariaDB's, which keeps the text) come back in the database's key order,
//! so objects nested below the tables here (an artifact's location, say)
//! can differ from Go's order and give another version than Argo would. That
//! costs Argo one more row, never a wrong read: a workflow names the version
//! its nodes were stored under.

use serde_json::{Map, Number, Value};

use crate::argo::plan::compress::Nodes;

/// Go's `json.Marshal` of a nodes map (node ID -> NodeStatus). One node is
/// turned into a JSON value at a time, so the bytes written are the only
/// copy of the whole map this makes (a value tree of 20,000 nodes would be
/// several times their size).
pub fn marshal_nodes(nodes: &Nodes) -> Vec<u8> {
    let mut out = Vec::new();
    out.push(b'{');
    // A BTreeMap's keys come sorted by their bytes, as Go sorts map keys.
    for (i, (id, node)) in nodes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(&mut out, id);
        out.push(b':');
        let node = serde_json::to_value(node).expect("a node status serializes");
        write(&mut out, &node, Kind::Struct(&NODE_STATUS));
    }
    out.push(b'}');
    out
}

/// The version Argo's offload repo gives these nodes.
pub fn nodes_version(nodes: &Nodes) -> String {
    offload_version(&marshal_nodes(nodes))
}

/// Argo's offload version of nodes marshalled as Go does: "fnv:" + FNV-32.
pub fn offload_version(marshalled: &[u8]) -> String {
    format!("fnv:{}", fnv1_32(marshalled))
}

/// FNV-1 (not 1a), 32 bits: Go's `hash/fnv.New32`.
fn fnv1_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, &b| {
        hash.wrapping_mul(0x0100_0193) ^ u32::from(b)
    })
}

/// How a value is written.
#[derive(Clone, Copy)]
enum Kind {
    /// As read: objects keep their order.
    Plain,
    /// A Go map: keys sorted, values plain.
    Map,
    Struct(&'static [Field]),
    SliceOf(&'static [Field]),
    /// Argo's `AnyString`: always written as a JSON string.
    AnyString,
    SliceOfAnyString,
}

/// When Go leaves a field out.
#[derive(Clone, Copy)]
enum Omit {
    /// `omitempty` on a string, number, bool, slice or map: "", 0, false,
    /// empty, or null (which Go reads as the zero value).
    Empty,
    /// `omitempty` on a pointer: only null.
    Nil,
    /// No `omitempty`, or a struct (never empty to Go): always written; the
    /// zero value when absent or null.
    Never(Zero),
}

#[derive(Clone, Copy)]
enum Zero {
    Str,
    Bool,
    /// `metav1.Time`'s zero value marshals as null.
    Null,
}

struct Field(&'static str, Omit, Kind);

use Kind::{AnyString, Map as GoMap, Plain, SliceOf, SliceOfAnyString, Struct};
use Omit::{Empty, Never, Nil};

const NODE_STATUS: [Field; 28] = [
    Field("id", Never(Zero::Str), Plain),
    Field("name", Never(Zero::Str), Plain),
    Field("displayName", Empty, Plain),
    Field("type", Never(Zero::Str), Plain),
    Field("templateName", Empty, Plain),
    Field("templateRef", Nil, Struct(&TEMPLATE_REF)),
    Field("templateScope", Empty, Plain),
    Field("phase", Empty, Plain),
    Field("boundaryID", Empty, Plain),
    Field("message", Empty, Plain),
    Field("startedAt", Never(Zero::Null), Plain),
    Field("finishedAt", Never(Zero::Null), Plain),
    Field("estimatedDuration", Empty, Plain),
    Field("progress", Empty, Plain),
    Field("resourcesDuration", Empty, GoMap),
    Field("podIP", Empty, Plain),
    Field("daemoned", Nil, Plain),
    Field("nodeFlag", Nil, Struct(&NODE_FLAG)),
    Field("inputs", Nil, Struct(&INPUTS)),
    Field("outputs", Nil, Struct(&OUTPUTS)),
    Field("children", Empty, Plain),
    Field("outboundNodes", Empty, Plain),
    Field("hostNodeName", Empty, Plain),
    Field("memoizationStatus", Nil, Struct(&MEMOIZATION_STATUS)),
    Field(
        "synchronizationStatus",
        Nil,
        Struct(&NODE_SYNCHRONIZATION_STATUS),
    ),
    Field("taskResultSynced", Nil, Plain),
    Field("failedPodRestarts", Empty, Plain),
    Field("restartingPodUID", Empty, Plain),
];

const TEMPLATE_REF: [Field; 3] = [
    Field("name", Empty, Plain),
    Field("template", Empty, Plain),
    Field("clusterScope", Empty, Plain),
];

const NODE_FLAG: [Field; 2] = [
    Field("hooked", Empty, Plain),
    Field("retried", Empty, Plain),
];

const INPUTS: [Field; 2] = [
    Field("parameters", Empty, SliceOf(&PARAMETER)),
    Field("artifacts", Empty, Plain),
];

const OUTPUTS: [Field; 4] = [
    Field("parameters", Empty, SliceOf(&PARAMETER)),
    Field("artifacts", Empty, Plain),
    Field("result", Nil, Plain),
    Field("exitCode", Nil, Plain),
];

const PARAMETER: [Field; 7] = [
    Field("name", Never(Zero::Str), Plain),
    Field("default", Nil, AnyString),
    Field("value", Nil, AnyString),
    Field("valueFrom", Nil, Struct(&VALUE_FROM)),
    Field("globalName", Empty, Plain),
    Field("enum", Empty, SliceOfAnyString),
    Field("description", Nil, AnyString),
];

const VALUE_FROM: [Field; 9] = [
    Field("path", Empty, Plain),
    Field("jsonPath", Empty, Plain),
    Field("jqFilter", Empty, Plain),
    Field("event", Empty, Plain),
    Field("parameter", Empty, Plain),
    Field("supplied", Nil, Plain),
    Field("configMapKeyRef", Nil, Plain),
    Field("default", Nil, AnyString),
    Field("expression", Empty, Plain),
];

const MEMOIZATION_STATUS: [Field; 3] = [
    Field("hit", Never(Zero::Bool), Plain),
    Field("key", Never(Zero::Str), Plain),
    Field("cacheName", Never(Zero::Str), Plain),
];

const NODE_SYNCHRONIZATION_STATUS: [Field; 1] = [Field("waiting", Empty, Plain)];

fn write(out: &mut Vec<u8>, value: &Value, kind: Kind) {
    match (kind, value) {
        (Kind::Map, Value::Object(map)) => write_map(out, map, Plain),
        (Struct(fields), Value::Object(map)) => write_struct(out, map, fields),
        (SliceOf(fields), Value::Array(items)) => write_array(out, items, Struct(fields)),
        (SliceOfAnyString, Value::Array(items)) => write_array(out, items, AnyString),
        (AnyString, Value::Number(n)) => write_string(out, &go_float_text(n, b'f')),
        (AnyString, Value::Bool(b)) => write_string(out, if *b { "true" } else { "false" }),
        (_, Value::Null) => out.extend_from_slice(b"null"),
        (_, Value::Bool(b)) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        (_, Value::Number(n)) => write_number(out, n),
        (_, Value::String(s)) => write_string(out, s),
        (_, Value::Array(items)) => write_array(out, items, Plain),
        (_, Value::Object(map)) => write_object(out, map.iter(), Plain),
    }
}

fn write_map(out: &mut Vec<u8>, map: &Map<String, Value>, values: Kind) {
    // Go sorts map keys by their bytes; so does `str`'s `Ord`.
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    write_object(out, entries.into_iter(), values);
}

fn write_object<'a>(
    out: &mut Vec<u8>,
    entries: impl Iterator<Item = (&'a String, &'a Value)>,
    values: Kind,
) {
    out.push(b'{');
    for (i, (key, value)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(out, key);
        out.push(b':');
        write(out, value, values);
    }
    out.push(b'}');
}

fn write_struct(out: &mut Vec<u8>, map: &Map<String, Value>, fields: &[Field]) {
    let mut first = true;
    let mut put = |out: &mut Vec<u8>, key: &str, value: &Value, kind: Kind| {
        out.push(if first { b'{' } else { b',' });
        first = false;
        write_string(out, key);
        out.push(b':');
        write(out, value, kind);
    };
    for Field(name, omit, kind) in fields {
        let value = map.get(*name);
        match (omit, value) {
            (Empty, Some(v)) if is_empty(v) => {}
            (Nil, Some(Value::Null)) | (Empty | Nil, None) => {}
            (Never(zero), None | Some(Value::Null)) => {
                let zero = match zero {
                    Zero::Str => Value::String(String::new()),
                    Zero::Bool => Value::Bool(false),
                    Zero::Null => Value::Null,
                };
                put(out, name, &zero, *kind);
            }
            (_, Some(v)) => put(out, name, v, *kind),
        }
    }
    for (key, value) in map {
        if !fields.iter().any(|Field(name, ..)| name == key) {
            put(out, key, value, Plain);
        }
    }
    if first {
        out.push(b'{');
    }
    out.push(b'}');
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

fn write_array(out: &mut Vec<u8>, items: &[Value], kind: Kind) {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write(out, item, kind);
    }
    out.push(b']');
}

fn write_number(out: &mut Vec<u8>, n: &Number) {
    if n.is_f64() {
        out.extend_from_slice(go_float_text(n, b'e').as_bytes());
    } else {
        out.extend_from_slice(n.to_string().as_bytes());
    }
}

/// A number as Go writes a float64: `encoding/json` uses the shortest
/// decimal, in exponent form below 1e-6 and from 1e21 on (`exponent` = b'e');
/// `AnyString` reads numbers with `FormatFloat(v, 'f', -1, 64)` (b'f').
fn go_float_text(n: &Number, exponent: u8) -> String {
    if !n.is_f64() {
        return n.to_string();
    }
    let f = n.as_f64().unwrap_or_default();
    let abs = f.abs();
    if exponent == b'e' && abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Rust writes "1e21" and "1e-7"; Go writes "1e+21" and "1e-07" and
        // then trims the exponent's leading zero back to "1e-7".
        let text = format!("{f:e}");
        match text.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
            _ => text,
        }
    } else {
        // Rust's `Display` for f64 is the shortest round-trip decimal
        // without an exponent, as Go's 'f' with precision -1.
        format!("{f}")
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A string as Go's encoder writes it with HTML escaping on (the default).
fn write_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '\\' => out.extend_from_slice(b"\\\\"),
            '"' => out.extend_from_slice(b"\\\""),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\0'..='\u{1f}' | '<' | '>' | '&' => {
                let b = c as u8;
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
            '\u{2028}' => out.extend_from_slice(b"\\u2028"),
            '\u{2029}' => out.extend_from_slice(b"\\u2029"),
            c => {
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn marshal(v: Value) -> String {
        String::from_utf8(marshal_nodes(&serde_json::from_value(v).unwrap())).unwrap()
    }

    #[test]
    fn fnv1_32_matches_go_hash_fnv_new32() {
        // Go: fnv.New32() over "", "a" and "{}" (FNV-1, not FNV-1a).
        assert_eq!(fnv1_32(b""), 2_166_136_261);
        assert_eq!(fnv1_32(b"a"), 84_696_446);
        assert_eq!(offload_version(b"{}"), "fnv:1450640401");
    }

    #[test]
    fn node_fields_in_go_order_map_keys_sorted() {
        let nodes = json!({
            "wf-b": {"children": ["wf-c"], "phase": "Failed", "type": "Pod", "name": "wf.b", "id": "wf-b",
                     "resourcesDuration": {"memory": 2, "cpu": 1}, "futureField": 1},
            "wf-a": {"id": "wf-a", "name": "wf.a", "type": "Pod", "startedAt": "2024-01-01T00:00:00Z"}
        });
        assert_eq!(
            marshal(nodes),
            r#"{"wf-a":{"id":"wf-a","name":"wf.a","type":"Pod","startedAt":"2024-01-01T00:00:00Z","finishedAt":null},"#
                .to_owned()
                + r#""wf-b":{"id":"wf-b","name":"wf.b","type":"Pod","phase":"Failed","startedAt":null,"finishedAt":null,"#
                + r#""resourcesDuration":{"cpu":1,"memory":2},"children":["wf-c"],"futureField":1}}"#
        );
    }

    #[test]
    fn empty_omitempty_fields_vanish_pointers_stay() {
        let nodes = json!({"n": {"id": "n", "name": "", "type": "Pod", "message": "", "children": [],
            "nodeFlag": {}, "daemoned": false, "outputs": {"parameters": [], "exitCode": "1"},
            "inputs": {"parameters": [{"value": 3, "name": "p", "enum": [1, true]}]}}});
        assert_eq!(
            marshal(nodes),
            r#"{"n":{"id":"n","name":"","type":"Pod","startedAt":null,"finishedAt":null,"daemoned":false,"nodeFlag":{},"#
                .to_owned()
                + r#""inputs":{"parameters":[{"name":"p","value":"3","enum":["1","true"]}]},"outputs":{"exitCode":"1"}}}"#
        );
    }

    #[test]
    fn strings_escaped_as_go_does() {
        let nodes = json!({"n": {"id": "n", "name": "a<b>&c\"\\\n\t\r\u{8}\u{c}\u{1}\u{7f}\u{2028}\u{2029}é", "type": "Pod"}});
        assert_eq!(
            marshal(nodes),
            "{\"n\":{\"id\":\"n\",\"name\":\"a\\u003cb\\u003e\\u0026c\\\"\\\\\\n\\t\\r\\b\\f\\u0001\u{7f}\\u2028\\u2029é\",\"type\":\"Pod\",\"startedAt\":null,\"finishedAt\":null}}"
        );
    }

    #[test]
    fn floats_written_as_go_does() {
        let text = |v: f64| go_float_text(&Number::from_f64(v).unwrap(), b'e');
        assert_eq!(text(1.5), "1.5");
        assert_eq!(text(1e21), "1e+21");
        assert_eq!(text(1e20), "100000000000000000000");
        assert_eq!(text(1e-7), "1e-7");
        assert_eq!(text(0.000001), "0.000001");
        assert_eq!(
            go_float_text(&Number::from_f64(1e21).unwrap(), b'f'),
            "1000000000000000000000"
        );
    }
}
