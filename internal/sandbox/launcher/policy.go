package launcher

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Policy is what the launcher applies to itself before it starts the
// runtime, so the runtime and everything it starts inherit it. The worker
// writes it on fd 5, one directive per line (Format); a launcher given no
// policy applies none.
type Policy struct {
	// Landlock turns on the filesystem, network and IPC-scope rules; the
	// paths and ports below are what stays allowed.
	Landlock   bool
	ReadDirs   []string // read and execute
	WriteDirs  []string // read, write and execute
	ReadFiles  []string // single files, read
	WriteFiles []string // single files (devices), read and write
	TCPConnect []int
	// Rlimits by name: as, nproc, nofile, fsize, cpu (seconds).
	Rlimits map[string]uint64
	// Root builds the run a root of its own (docs/sandbox.md, "A root of
	// its own"): a tmpfs holding only Binds, a fresh /proc, a /dev of a
	// few devices and a private /tmp, entered with pivot_root. It needs the
	// launcher's own user and mount namespaces.
	Root bool
	// Binds are what the run's root shows of the host, each from a
	// descriptor the worker opened and sent with the Start message.
	Binds []Bind
	// Loopback brings up the loopback interface of the run's network
	// namespace; ProxyPort, when not 0, is a port on 127.0.0.1 inside it
	// where the launcher listens and hands the listener to the worker,
	// which serves the egress proxy on it.
	Loopback  bool
	ProxyPort int
	// Seccomp installs the run's seccomp filter on the launcher (every
	// thread) and so on the runtime.
	Seccomp bool
	// TmpSize bounds the run's private /tmp (bytes; 0: 64 MiB).
	TmpSize uint64
	// Workspace, with WorkspaceSize, makes the bind at that target a
	// tmpfs of WorkspaceSize bytes holding a copy of what the worker laid
	// out, and hands the worker a descriptor of it with the receipt (a
	// worker that is not root cannot mount it itself; docs/sandbox.md,
	// "The workspace's own filesystem").
	Workspace     string
	WorkspaceSize uint64
}

// Bind is one host path the run's root shows: the descriptor at index FD
// of those sent with the Start message, mounted at Target, read-only unless
// Write. Dir tells a directory from a file.
type Bind struct {
	FD     int
	Target string
	Write  bool
	Dir    bool
}

// Empty reports whether p asks for nothing.
func (p Policy) Empty() bool {
	return !p.Landlock && len(p.Rlimits) == 0 && !p.Root && !p.Loopback && !p.Seccomp
}

// Format encodes p.
func (p Policy) Format() string {
	var b strings.Builder
	line := func(k, v string) { b.WriteString(k + " " + v + "\n") }
	if p.Landlock {
		line("landlock", "on")
	}
	for _, s := range p.ReadDirs {
		line("ro", s)
	}
	for _, s := range p.WriteDirs {
		line("rw", s)
	}
	for _, s := range p.ReadFiles {
		line("rof", s)
	}
	for _, s := range p.WriteFiles {
		line("rwf", s)
	}
	for _, n := range p.TCPConnect {
		line("tcp", strconv.Itoa(n))
	}
	for k, v := range p.Rlimits {
		line("rlimit", k+" "+strconv.FormatUint(v, 10))
	}
	if p.Root {
		line("root", "on")
	}
	for _, m := range p.Binds {
		rw, kind := "r", "f"
		if m.Write {
			rw = "w"
		}
		if m.Dir {
			kind = "d"
		}
		line("bind", strconv.Itoa(m.FD)+" "+rw+" "+kind+" "+m.Target)
	}
	if p.Loopback {
		line("loopback", "on")
	}
	if p.Seccomp {
		line("seccomp", "on")
	}
	if p.ProxyPort != 0 {
		line("proxy", strconv.Itoa(p.ProxyPort))
	}
	if p.TmpSize != 0 {
		line("tmpsize", strconv.FormatUint(p.TmpSize, 10))
	}
	if p.Workspace != "" {
		line("wstmpfs", strconv.FormatUint(p.WorkspaceSize, 10)+" "+p.Workspace)
	}
	return b.String()
}

// ParsePolicy decodes what Format wrote.
func ParsePolicy(r io.Reader) (Policy, error) {
	p := Policy{Rlimits: map[string]uint64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		switch k {
		case "":
		case "landlock":
			p.Landlock = v == "on"
		case "ro":
			p.ReadDirs = append(p.ReadDirs, v)
		case "rw":
			p.WriteDirs = append(p.WriteDirs, v)
		case "rof":
			p.ReadFiles = append(p.ReadFiles, v)
		case "rwf":
			p.WriteFiles = append(p.WriteFiles, v)
		case "tcp":
			n, err := strconv.Atoi(v)
			if err != nil {
				return p, fmt.Errorf("launcher: policy: tcp %q", v)
			}
			p.TCPConnect = append(p.TCPConnect, n)
		case "rlimit":
			name, n, _ := strings.Cut(v, " ")
			x, err := strconv.ParseUint(n, 10, 64)
			if err != nil {
				return p, fmt.Errorf("launcher: policy: rlimit %q", v)
			}
			p.Rlimits[name] = x
		case "root":
			p.Root = v == "on"
		case "bind":
			f := strings.SplitN(v, " ", 4)
			if len(f) != 4 {
				return p, fmt.Errorf("launcher: policy: bind %q", v)
			}
			fd, err := strconv.Atoi(f[0])
			if err != nil || fd < 0 || (f[1] != "r" && f[1] != "w") || (f[2] != "d" && f[2] != "f") || !strings.HasPrefix(f[3], "/") {
				return p, fmt.Errorf("launcher: policy: bind %q", v)
			}
			p.Binds = append(p.Binds, Bind{FD: fd, Write: f[1] == "w", Dir: f[2] == "d", Target: f[3]})
		case "loopback":
			p.Loopback = v == "on"
		case "seccomp":
			p.Seccomp = v == "on"
		case "proxy":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 65535 {
				return p, fmt.Errorf("launcher: policy: proxy %q", v)
			}
			p.ProxyPort = n
		case "wstmpfs":
			n, path, _ := strings.Cut(v, " ")
			x, err := strconv.ParseUint(n, 10, 64)
			if err != nil || x == 0 || !strings.HasPrefix(path, "/") {
				return p, fmt.Errorf("launcher: policy: wstmpfs %q", v)
			}
			p.WorkspaceSize, p.Workspace = x, path
		case "tmpsize":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return p, fmt.Errorf("launcher: policy: tmpsize %q", v)
			}
			p.TmpSize = n
		default:
			return p, fmt.Errorf("launcher: policy: unknown directive %q", k)
		}
	}
	return p, sc.Err()
}
