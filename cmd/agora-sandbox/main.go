// Command agora-sandbox is the sandbox launcher on its own: a small binary
// the worker starts each sub-agent through when it finds it next to its own
// executable (or at AGORA_SANDBOX_LAUNCHER), because it starts faster than
// the whole worker binary re-executed (docs/sandbox.md). It is not meant to
// be run by hand.
package main

import (
	"fmt"
	"os"

	"github.com/agora-dispatch/agora/internal/sandbox/launcher"
)

func main() {
	// The launcher's init has already taken over when argv[0] names it;
	// anything else is a mistake.
	fmt.Fprintf(os.Stderr, "agora-sandbox: started as %q; the worker runs this binary with argv[0] %q\n", os.Args[0], launcher.Name)
	os.Exit(2)
}
