//! What the tests share.

use std::sync::Arc;

use futures::future::BoxFuture;
use rewind::localcluster::LocalCluster;

/// A test: gets the shared cluster and the name of its own fresh namespace.
pub type Test = fn(Arc<LocalCluster>, String) -> BoxFuture<'static, anyhow::Result<()>>;

/// A valid namespace name (DNS label) unique to the test.
pub fn namespace_for(test: &str) -> String {
    let name: String = test
        .rsplit("::")
        .next()
        .unwrap_or(test)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    name.chars()
        .take(63)
        .collect::<String>()
        .trim_end_matches('-')
        .to_owned()
}
