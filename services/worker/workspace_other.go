//go:build !linux

package worker

import "errors"

// Workspaces are recycled on Linux only: elsewhere every one is removed.

func renameNoReplace(string, string) error { return errors.ErrUnsupported }

func noXattrs(string) bool { return false }
