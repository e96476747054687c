//go:build !linux

package worker

import (
	"errors"
	"os"
)

// mountTmpfs is Linux only; the worker never asks for it elsewhere (a
// run's own filesystem needs namespaces).
func mountTmpfs(string, string) error {
	return errors.New("worker: a workspace filesystem needs Linux")
}

func detach(string) {}

func fsFull(string) bool { return false }

func openUnder(string, string) (*os.File, error) {
	return nil, errors.New("worker: a workspace filesystem needs Linux")
}

func emptyTmpfs(*os.File) bool { return false }
