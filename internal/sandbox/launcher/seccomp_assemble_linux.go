//go:build linux && !amd64

package launcher

import (
	"golang.org/x/net/bpf"

	"github.com/agora-dispatch/agora/internal/sandbox/launcher/seccompgen"
)

// seccompPrograms assembles the filter for this architecture, which has no
// table made ahead of time.
func seccompPrograms() ([][]bpf.RawInstruction, error) { return seccompgen.Programs("") }
