//go:build !linux

package chaos

import (
	"context"
	"errors"
	"time"
)

// fullStore fills the store's own filesystem on Linux (fullstore_linux.go);
// elsewhere the soak leaves the fault out.
type fullStore struct{}

func newFullStore(string) (*fullStore, error) {
	return nil, errors.New("filling the store's filesystem needs Linux (a tmpfs of its own)")
}

func (*fullStore) fill(context.Context, time.Duration) {}
func (*fullStore) close()                              {}
