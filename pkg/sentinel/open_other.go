//go:build !unix

package sentinel

import "os"

// openFlags opens the sentinel read-only; on these systems os.Root already
// refuses to follow a symlink out of the workspace.
const openFlags = os.O_RDONLY
