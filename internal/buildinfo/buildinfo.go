// Package buildinfo is Agora's one version: every service's NATS micro
// endpoint, the MCP servers, the inbox's announcement, the served OpenAPI
// document and `agora version` report it (docs/settings.md, "Versions").
package buildinfo

import (
	"runtime/debug"
	"strings"
	"sync"
)

// Release is the version this source tree is on its way to; a build that
// is not of a tagged module version reports Release plus its VCS revision.
const Release = "0.3.0"

// Version reports the build's version: the module version when the binary
// was built from a tagged module (go install …@v0.3.0), else
// Release-dev+<revision>[.dirty] from the VCS stamp Go records, else
// Release-dev. It is computed once.
func Version() string { return version() }

var version = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Release + "-dev"
	}
	if v := strings.TrimPrefix(bi.Main.Version, "v"); v != "" && v != "(devel)" && !strings.Contains(v, "-0.") {
		return v
	}
	var rev string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return Release + "-dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	v := Release + "-dev+" + rev
	if dirty {
		v += ".dirty"
	}
	return v
})

// Revision reports the VCS revision the build records, or "".
func Revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return ""
}
