//! Finding the control-plane binaries built by tools/controlplane/build.sh.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{Component, Error};
use crate::testenv::io_error;

/// Environment variable naming a directory that holds every control-plane binary.
pub const BIN_DIR_ENV: &str = "REWIND_BIN_DIR";

const BUILD_SCRIPT: &str = "tools/controlplane/build.sh";

/// A directory holding the control-plane binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// `dir` if given, else $REWIND_BIN_DIR, else whatever tools/controlplane/build.sh prints
    /// (building the binaries on first use; a warm run takes about a second).
    pub fn locate(dir: Option<&Path>) -> Result<Self, Error> {
        if let Some(dir) = dir {
            return Ok(Self {
                dir: dir.to_owned(),
            });
        }
        if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
            return Ok(Self { dir: dir.into() });
        }
        build()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of `component`'s binary, or an error naming it and how to build it.
    pub fn path(&self, component: Component) -> Result<PathBuf, Error> {
        let path = self.dir.join(component.binary());
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::BinaryMissing {
                name: component.binary(),
                dir: self.dir.clone(),
                build: build_command(),
            })
        }
    }
}

/// The repository root: where this crate was compiled from, else the current directory
/// (for a binary run outside its source tree).
fn build_script() -> PathBuf {
    let compiled_in = Path::new(env!("CARGO_MANIFEST_DIR")).join(BUILD_SCRIPT);
    if compiled_in.is_file() {
        compiled_in
    } else {
        PathBuf::from(BUILD_SCRIPT)
    }
}

fn build_command() -> String {
    format!("bash {}", build_script().display())
}

fn build() -> Result<Binaries, Error> {
    let script = build_script();
    tracing::debug!(script = %script.display(), "locating control-plane binaries");
    // stderr is inherited so a cold build's progress (tens of minutes) is visible.
    let output = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(io_error("running", &script))?;
    if !output.status.success() {
        return Err(Error::Build {
            command: build_command(),
            status: output.status,
        });
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout.lines().last().unwrap_or_default().trim();
    Ok(Binaries { dir: dir.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_named_with_the_command_that_builds_it() {
        let empty = tempfile::tempdir().unwrap();
        let binaries = Binaries::locate(Some(empty.path())).unwrap();
        let err = binaries.path(Component::ApiServer).unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(
                err,
                Error::BinaryMissing {
                    name: "kube-apiserver",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(message.contains("tools/controlplane/build.sh"), "{message}");
        assert!(
            message.contains(&empty.path().display().to_string()),
            "{message}"
        );
    }

    #[test]
    fn a_present_binary_is_found() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("etcd"), "").unwrap();
        let binaries = Binaries::locate(Some(dir.path())).unwrap();
        assert_eq!(
            binaries.path(Component::Etcd).unwrap(),
            dir.path().join("etcd")
        );
    }
}
