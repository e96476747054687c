package buildinfo_test

import (
	"regexp"
	"testing"

	"github.com/agora-dispatch/agora/internal/buildinfo"
)

// A test binary records no module version: the version is the release in
// development, with the revision when the build stamped one.
func TestVersion(t *testing.T) {
	v := buildinfo.Version()
	if !regexp.MustCompile(`^` + regexp.QuoteMeta(buildinfo.Release) + `-dev(\+[0-9a-f]{1,12}(\.dirty)?)?$`).MatchString(v) {
		t.Errorf("Version() = %q, want %s-dev[+revision]", v, buildinfo.Release)
	}
	if v != buildinfo.Version() {
		t.Error("Version() changes between calls")
	}
}
