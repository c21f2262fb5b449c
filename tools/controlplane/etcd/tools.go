//go:build tools

// Package tools pins etcd; `go install go.etcd.io/etcd/server/v3@v` is refused
// because of etcd's relative replaces, but building it from a module that
// requires it works.
package tools

import _ "go.etcd.io/etcd/server/v3"
