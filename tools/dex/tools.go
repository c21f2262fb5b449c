//go:build tools

// Package tools pins dex, the OpenID Connect provider the SSO test logs in
// through. Dex's module path has no /v2, so its v2.x tags are no module
// versions: it is pinned by pseudo-version, and built from a module that
// requires it (dex's own replace of its api/v2 module does not apply here;
// the published api/v2 module serves instead).
package tools

import _ "github.com/dexidp/dex/cmd/dex"
