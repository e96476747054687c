//go:build linux

package launcher

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// loopbackUp brings up lo in the launcher's network namespace, the only
// interface a run's namespace has (docs/sandbox.md, "Namespaces: a box of
// its own").
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: up: %w", err)
	}
	return nil
}

// listenProxy listens on 127.0.0.1:port in the run's namespace and returns
// the listening socket, which the launcher hands to the worker: the worker
// accepts the run's connections on it and serves the egress proxy from the
// host's namespace.
func listenProxy(port int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("proxy listener: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("proxy listener: bind 127.0.0.1:%d: %w", port, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("proxy listener: %w", err)
	}
	return fd, nil
}
