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
	// Cgroups are cgroup.procs files the launcher moves itself into.
	Cgroups []string
}

// Empty reports whether p asks for nothing.
func (p Policy) Empty() bool {
	return !p.Landlock && len(p.Rlimits) == 0 && len(p.Cgroups) == 0
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
	for _, s := range p.Cgroups {
		line("cgroup", s)
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
		case "cgroup":
			p.Cgroups = append(p.Cgroups, v)
		default:
			return p, fmt.Errorf("launcher: policy: unknown directive %q", k)
		}
	}
	return p, sc.Err()
}
