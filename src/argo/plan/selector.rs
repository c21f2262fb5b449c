//! Argo's node field selector (`argo retry --node-field-selector`): the
//! grammar of Kubernetes' `fields.ParseSelector` (apimachinery
//! `pkg/fields/selector.go`) over the node fields of Argo's
//! `SelectorMatchesNode`.
//!
//! Hand-written rather than borrowed from a crate: the error messages, the
//! term sorting (which decides which error is reported) and the quirk that an
//! empty term such as `=` or `!=` matches everything must all be Go's.

use std::borrow::Cow;
use std::collections::HashMap;

use thiserror::Error;

use crate::argo::workflow::NodeStatus;

/// Why a selector does not parse; the messages are apimachinery's.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    NoOperator { selector: String, term: String },
    #[error("invalid field selector: invalid escape sequence: {sequence}")]
    InvalidEscape { sequence: String },
    /// Go prints the character as its code point (`%v` of a rune).
    #[error("invalid field selector: unescaped character in value: {}", u32::from(*.character))]
    UnescapedCharacter { character: char },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Term {
    field: String,
    value: String,
    equal: bool,
}

/// A parsed selector: all terms must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    terms: Vec<Term>,
}

/// The fields a node offers to a selector.
pub type NodeFields<'a> = HashMap<String, Cow<'a, str>>;

/// Go panics (nil pointer) when it builds the fields of a node whose input
/// parameter has no value; the planner reports this as Argo crashing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParameterWithoutValue {
    pub node_id: String,
    pub parameter: String,
}

impl Selector {
    /// `fields.ParseSelector`.
    pub fn parse(selector: &str) -> Result<Self, SelectorError> {
        let mut parts = split_terms(selector);
        parts.sort_unstable();
        let mut terms = Vec::with_capacity(parts.len());
        for part in parts.into_iter().filter(|p| !p.is_empty()) {
            let Some((field, op, rhs)) = split_term(part) else {
                return Err(SelectorError::NoOperator {
                    selector: selector.to_owned(),
                    term: part.to_owned(),
                });
            };
            let value = unescape_value(rhs)?;
            // `Transform` turns a term with an empty field and value into
            // `Everything()`, which an `andTerm` then drops.
            if field.is_empty() && value.is_empty() {
                continue;
            }
            terms.push(Term {
                field: field.to_owned(),
                value,
                equal: op != "!=",
            });
        }
        Ok(Self { terms })
    }

    /// Whether the fields satisfy every term; a missing field reads as "".
    pub fn matches(&self, fields: &NodeFields<'_>) -> bool {
        self.terms.iter().all(|t| {
            let actual = fields.get(&t.field).map_or("", |v| v);
            (actual == t.value) == t.equal
        })
    }

    /// Argo's `SelectorMatchesNode`.
    pub fn matches_node(&self, node: &NodeStatus) -> Result<bool, ParameterWithoutValue> {
        Ok(self.matches(&node_fields(node)?))
    }
}

/// The fields of Argo's `SelectorMatchesNode`.
pub fn node_fields(node: &NodeStatus) -> Result<NodeFields<'_>, ParameterWithoutValue> {
    let mut fields: NodeFields<'_> = HashMap::with_capacity(8);
    fields.insert(
        "displayName".into(),
        node.display_name.as_deref().unwrap_or_default().into(),
    );
    fields.insert("templateName".into(), node_template(node).into());
    fields.insert("phase".into(), node.phase().into());
    fields.insert("name".into(), node.name.as_str().into());
    fields.insert("id".into(), node.id.as_str().into());
    if let Some(r) = &node.template_ref {
        fields.insert(
            "templateRef.name".into(),
            r.name.as_deref().unwrap_or_default().into(),
        );
        fields.insert(
            "templateRef.template".into(),
            r.template.as_deref().unwrap_or_default().into(),
        );
    }
    if let Some(inputs) = &node.inputs {
        for p in inputs.get().parameters.into_iter().flatten() {
            let Some(value) = p.value else {
                return Err(ParameterWithoutValue {
                    node_id: node.id.to_string(),
                    parameter: p.name,
                });
            };
            fields.insert(format!("inputs.parameters.{}.value", p.name), value.into());
        }
    }
    Ok(fields)
}

fn node_template(node: &NodeStatus) -> &str {
    match &node.template_ref {
        Some(r) => r.template.as_deref().unwrap_or_default(),
        None => node.template_name.as_deref().unwrap_or_default(),
    }
}

/// `splitTerms`: split at commas not escaped by a backslash.
fn split_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::with_capacity(1);
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in selector.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&selector[start..i]);
            start = i + 1;
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// `splitTerm`: the first operator, trying `!=`, `==`, `=` at each position.
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if rest.starts_with(op) {
                return Some((&term[..i], op, &term[i + op.len()..]));
            }
        }
    }
    None
}

/// `UnescapeValue`.
fn unescape_value(s: &str) -> Result<String, SelectorError> {
    if !s.contains(['\\', ',', '=']) {
        return Ok(s.to_owned());
    }
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => {
                    return Err(SelectorError::InvalidEscape {
                        sequence: format!("\\{c}"),
                    });
                }
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => return Err(SelectorError::UnescapedCharacter { character: c }),
            _ => out.push(c),
        }
    }
    if in_slash {
        return Err(SelectorError::InvalidEscape {
            sequence: "\\".into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argo::workflow::{IoParameters, Lazy, Parameter, TemplateRef};

    fn node() -> NodeStatus {
        NodeStatus {
            id: "wf-1".into(),
            name: "wf[0].step".into(),
            display_name: Some("step".into()),
            type_: "Pod".into(),
            template_name: Some("tmpl".into()),
            phase: Some("Failed".into()),
            inputs: Some(Lazy::new(&IoParameters {
                parameters: Some(vec![Parameter {
                    name: "p".into(),
                    value: Some("a,b=c".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn matches(selector: &str, node: &NodeStatus) -> bool {
        Selector::parse(selector)
            .unwrap()
            .matches_node(node)
            .unwrap()
    }

    #[test]
    fn every_node_field_can_be_selected() {
        let mut n = node();
        assert!(matches("displayName=step", &n));
        assert!(matches("templateName=tmpl", &n));
        assert!(matches("phase=Failed", &n));
        assert!(matches("name=wf[0].step", &n));
        assert!(matches("id=wf-1", &n));
        assert!(matches(r"inputs.parameters.p.value=a\,b\=c", &n));
        assert!(!matches("templateRef.name=lib", &n));
        n.template_ref = Some(Box::new(TemplateRef {
            name: Some("lib".into()),
            template: Some("t2".into()),
            ..Default::default()
        }));
        assert!(matches("templateRef.name=lib,templateRef.template=t2", &n));
        // With a templateRef, templateName is the referenced template.
        assert!(matches("templateName=t2", &n));
        assert!(!matches("templateName=tmpl", &n));
    }

    #[test]
    fn operators_and_conjunction() {
        let n = node();
        assert!(matches("phase==Failed", &n));
        assert!(matches("phase!=Succeeded", &n));
        assert!(!matches("phase!=Failed", &n));
        assert!(matches("phase=Failed,id=wf-1", &n));
        assert!(!matches("phase=Failed,id=wf-2", &n));
        // A missing field reads as "".
        assert!(matches("nope=", &n));
        assert!(!matches("nope=x", &n));
        assert!(matches("nope!=x", &n));
    }

    #[test]
    fn empty_terms_match_everything() {
        let n = node();
        for s in ["", ",", "=", "!=", "==", "=,phase=Failed"] {
            assert!(matches(s, &n), "{s:?}");
        }
        // "!=" with an empty field would never hold, but Go drops it.
        assert!(matches("!=,id=wf-1", &n));
    }

    #[test]
    fn operator_is_the_first_one_found() {
        // "a!==b" splits at "!=" with value "=b": an unescaped "=".
        assert_eq!(
            Selector::parse("a!==b").unwrap_err().to_string(),
            "invalid field selector: unescaped character in value: 61"
        );
        let term = |s: &str| Selector::parse(s).unwrap().terms;
        assert_eq!(
            term("x!=y"),
            vec![Term {
                field: "x".into(),
                value: "y".into(),
                equal: false
            }]
        );
        assert_eq!(
            term("x==y"),
            vec![Term {
                field: "x".into(),
                value: "y".into(),
                equal: true
            }]
        );
        assert_eq!(
            term("x y=z"),
            vec![Term {
                field: "x y".into(),
                value: "z".into(),
                equal: true
            }]
        );
    }

    #[test]
    fn errors_are_apimachinerys() {
        let err = |s: &str| Selector::parse(s).unwrap_err().to_string();
        assert_eq!(
            err("phase"),
            "invalid selector: 'phase'; can't understand 'phase'"
        );
        assert_eq!(
            err(r"a=b\x"),
            r"invalid field selector: invalid escape sequence: \x"
        );
        assert_eq!(
            err(r"a=b\"),
            r"invalid field selector: invalid escape sequence: \"
        );
        assert_eq!(
            err("a=b=c"),
            "invalid field selector: unescaped character in value: 61"
        );
        // Terms are sorted before parsing: the first bad term in byte order is reported.
        assert_eq!(
            err("zzz,aaa"),
            "invalid selector: 'zzz,aaa'; can't understand 'aaa'"
        );
        assert_eq!(
            err(r"b=\q,a"),
            "invalid selector: 'b=\\q,a'; can't understand 'a'"
        );
    }

    #[test]
    fn escaped_comma_does_not_split() {
        let s = Selector::parse(r"a=x\,y").unwrap();
        assert_eq!(
            s.terms,
            vec![Term {
                field: "a".into(),
                value: "x,y".into(),
                equal: true
            }]
        );
    }

    #[test]
    fn input_parameter_without_value_is_go_panicking() {
        let mut n = node();
        let mut inputs = n.inputs.as_ref().unwrap().get();
        inputs.parameters.as_mut().unwrap()[0].value = None;
        n.inputs = Some(Lazy::new(&inputs));
        let err = Selector::parse("id=x")
            .unwrap()
            .matches_node(&n)
            .unwrap_err();
        assert_eq!(
            err,
            ParameterWithoutValue {
                node_id: "wf-1".into(),
                parameter: "p".into()
            }
        );
    }
}
