//! The user contract: what users write to ask for a retry and what rewind
//! writes back. Stable once shipped.

pub mod crd;
pub mod hint;
pub mod names;
pub mod request;

/// Annotations from (key, value) pairs, for the unit tests of every layer.
#[cfg(test)]
pub(crate) fn annotations_of(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
