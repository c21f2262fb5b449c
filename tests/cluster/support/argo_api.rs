//! Argo's retry API called over HTTP(S) by curl, as Argo's clients call it.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context as _, ensure};
use serde_json::Value;

/// A free port on loopback for the API listener.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(probe.local_addr()?)
}

/// `PUT url` with `authorization` (the header's whole value) and `body`, as curl sends it;
/// the HTTP status and the JSON answer.
pub async fn put(
    url: &str,
    authorization: Option<&str>,
    body: &Value,
    ca: Option<&Path>,
) -> anyhow::Result<(u16, Value)> {
    call("PUT", url, authorization, Some(body), ca).await
}

/// `method url` with `authorization` and `body` (if any), as curl sends it; the HTTP status
/// and the JSON answer.
pub async fn call(
    method: &str,
    url: &str,
    authorization: Option<&str>,
    body: Option<&Value>,
    ca: Option<&Path>,
) -> anyhow::Result<(u16, Value)> {
    let mut command = tokio::process::Command::new("curl");
    command.args(["-sS", "-X", method, "-w", "\n%{http_code}"]);
    if let Some(body) = body {
        command.args(["-H", "Content-Type: application/json"]);
        command.args(["--data-binary", &body.to_string()]);
    }
    if let Some(value) = authorization {
        command.args(["-H", &format!("Authorization: {value}")]);
    }
    if let Some(ca) = ca {
        command.arg("--cacert").arg(ca);
    }
    let out = command
        .arg(url)
        .output()
        .await
        .context("running curl (Debian package curl)")?;
    ensure!(
        out.status.success(),
        "curl {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let (json, code) = text.rsplit_once('\n').context("curl printed the status")?;
    let value = serde_json::from_str(json).with_context(|| format!("the answer {json:?}"))?;
    Ok((code.trim().parse()?, value))
}
