//go:build linux

package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fullStore is the store's own filesystem, a tmpfs the soak fills up and
// frees: writes to the store fail with ENOSPC meanwhile, and the embedded
// server restarts JetStream once there is room again
// (internal/natsserver).
type fullStore struct {
	dir    string
	filler string
}

// newFullStore mounts a tmpfs on dir (created). It needs the privilege
// to mount (root).
func newFullStore(dir string) (*fullStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1g,mode=0700"); err != nil {
		return nil, fmt.Errorf("mount a tmpfs for the store: %w (run as root)", err)
	}
	return &fullStore{dir: dir, filler: filepath.Join(dir, "filler")}, nil
}

// fill takes every free byte of the store's filesystem for hold (or until
// ctx ends), then frees it.
func (f *fullStore) fill(ctx context.Context, hold time.Duration) {
	defer os.Remove(f.filler)
	fd, err := os.Create(f.filler)
	if err != nil {
		return
	}
	defer fd.Close()
	var st unix.Statfs_t
	if unix.Statfs(f.dir, &st) == nil && st.Bavail > 0 {
		_ = unix.Fallocate(int(fd.Fd()), 0, 0, int64(st.Bavail)*st.Bsize)
	}
	// What fallocate left (rounding, a write meanwhile), byte by block.
	buf := make([]byte, 64<<10)
	for {
		if _, err := fd.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				return
			}
			break
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(hold):
	}
}

// close unmounts the store's filesystem (after the server stopped).
func (f *fullStore) close() { _ = unix.Unmount(f.dir, unix.MNT_DETACH) }
