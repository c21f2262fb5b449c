# The two commands README.md promises: `make demo` and `make test`.
# Go builds of the control plane are cached under ~/.cache/rewind (REWIND_CACHE).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c

.PHONY: demo try test test-ui test-compat controlplane

# Builds (once) etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl and kwok from Go modules; prints where they are.
controlplane:
	@tools/controlplane/build.sh

# The archived part of the demo runs PostgreSQL (Debian package, installed when
# missing) and Argo's own DB code (tools/argodb, built once) to write the archive;
# `make demo DEMO_ARGS=--no-archived` needs neither, but they are cheap once there.
demo:
	tools/db/install.sh
	tools/argodb/build.sh >/dev/null
	REWIND_BIN_DIR=$$(tools/controlplane/build.sh) cargo run --release --locked --features testenv -- demo $(DEMO_ARGS)

# A local cluster to try rewind on, as README.md walks through it: Argo's
# workflow-controller runs workflows on fake nodes, and the chart, once installed
# with Helm, runs its controller here as a process (src/testenv/tryout.rs). It
# prints the exports to paste (KUBECONFIG, PATH with kubectl, helm, argo and
# rewind, ARGO_SERVER); Ctrl-C stops it.
try:
	tools/helm/build.sh >/dev/null
	tools/argo/build.sh v4 cli >/dev/null
	REWIND_BIN_DIR=$$(tools/controlplane/build.sh) cargo run --release --locked --features testenv -- local-cluster --try

# Also installs PostgreSQL and MariaDB (Debian packages) when missing and builds
# the Argo DB helpers (tools/argodb) that write Argo's own tables for the tests;
# Helm, actionlint and hadolint (tests/install.rs and the chart's cluster test)
# and helm-docs (tests/docs.rs: the chart's README) are built first so their
# cold build is not counted in a test's time.
# Argo's own `argo` binary (CLI and server, tools/argo/build.sh cli), nginx
# and Hera (tools/clients/install.sh) serve the end-to-end tests of rewind's
# Argo API (tests/e2e's cli-* and hera-* scenarios); dex (tools/dex), an
# OpenID Connect provider built from its Go module, logs users in to a real
# argo server in SSO mode for the API's SSO test (tests/cluster).
# cargo-deny (tools/deny) checks Cargo.lock against deny.toml (licenses,
# duplicate versions, sources) before the tests; deny.toml says why the
# advisories check is not among them. Prometheus and promtool
# (tools/prometheus) check and test the chart's alerts (tests/monitoring.rs)
# and evaluate the dashboard against a real controller (tests/cluster).
test:
	tools/db/install.sh
	tools/argodb/build.sh >/dev/null
	tools/helm/build.sh >/dev/null
	tools/helmdocs/build.sh >/dev/null
	tools/lint/build.sh >/dev/null
	tools/deny/build.sh >/dev/null
	tools/argo/build.sh >/dev/null
	tools/prometheus/build.sh >/dev/null
	tools/argo/build.sh cli >/dev/null
	tools/clients/install.sh >/dev/null
	tools/dex/build.sh >/dev/null
	$$(tools/deny/build.sh)/cargo-deny --locked check --hide-inclusion-graph licenses bans sources
	REWIND_BIN_DIR=$$(tools/controlplane/build.sh) cargo test --locked --all-targets --features testenv

# The compatibility run on each Kubernetes minor, 1.34 to 1.37 (make test runs
# the full suite on the newest): each minor's control plane (built once, about
# ten minutes cold on 2 cores), the cluster tests' compatibility subset and one
# end-to-end scenario with Argo's workflow-controller; it records each minor's
# result in tools/compat/results.tsv, from which README.md's table is made.
# REWIND_K8S_MINORS="1.34" runs one.
test-compat:
	tools/db/install.sh
	tools/argodb/build.sh >/dev/null
	tools/helm/build.sh >/dev/null
	tools/argo/build.sh >/dev/null
	tools/argo/build.sh cli >/dev/null
	tools/compat/run.sh

# Argo's UI in headless Chromium pressing Retry on a live and an archived
# workflow served by rewind (tests/e2e, scenarios ui-*). Its own target: Argo's
# UI is built from its module's sources first (tools/argo/build.sh cli-ui: npm
# install and webpack, then the argo binary: 438 s cold on 2 cores), which make test
# should not wait for. Debian's chromium and playwright-core come from
# tools/clients/browser.sh.
test-ui:
	tools/db/install.sh
	tools/argo/build.sh v4 peer cli cli-ui >/dev/null
	tools/clients/install.sh >/dev/null
	tools/clients/browser.sh >/dev/null
	REWIND_BIN_DIR=$$(tools/controlplane/build.sh) cargo test --locked --features testenv --test e2e -- --ignored ui-
