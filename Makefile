# The two commands README.md promises: `make demo` and `make test`.
# Go builds of the control plane are cached under ~/.cache/rewind (REWIND_CACHE).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c

.PHONY: demo test controlplane

# Builds (once) etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl and kwok from Go modules; prints where they are.
controlplane:
	@tools/controlplane/build.sh

demo:
	REWIND_BIN_DIR=$$(tools/controlplane/build.sh) cargo run --release --locked -- demo $(DEMO_ARGS)

test:
	tools/argo/build.sh >/dev/null
	REWIND_BIN_DIR=$$(tools/controlplane/build.sh) cargo test --locked --all-targets
