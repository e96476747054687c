package subagent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// The operator's floor (docs/sandbox.md, "The operator's floor"): the
// settings that bound what a definition's sandbox block may ask for. The
// dispatcher refuses a request whose definition is below the floor, the
// worker refuses to run one, and `agora subagent apply` refuses to store
// one; each names the setting that would allow it.
const (
	// FloorSetting names the weakest sandbox mode a definition may ask
	// for: strict, standard (the default) or off.
	FloorSetting = "AGORA_SANDBOX_FLOOR"
	// AllowPathsSetting lists the absolute path prefixes read_paths and
	// write_paths may name, comma separated.
	AllowPathsSetting = "AGORA_SANDBOX_ALLOW_PATHS"
	// AllowHostsSetting lists the destinations network.allow may name,
	// comma separated.
	AllowHostsSetting = "AGORA_SANDBOX_ALLOW_HOSTS"
)

// None is the value of AllowPathsSetting or AllowHostsSetting that lets a
// definition add nothing.
const None = "none"

// Floor is the operator's floor. Its zero value is the default: mode
// standard, and any clean absolute path and any destination may be added
// (what a definition may name without a floor).
type Floor struct {
	// Mode is the weakest mode a definition may name (strict > standard
	// > off); empty means standard.
	Mode string
	// Paths are the prefixes read_paths and write_paths may name: a path
	// is allowed when it is a prefix or lies under one ("/srv" allows
	// "/srv" and "/srv/data", not "/srvx"). Empty allows any path; the
	// single entry None allows none. Entries are trimmed of spaces.
	Paths []string
	// Hosts are the destinations network.allow may name, in its forms:
	// "host:port", "*.domain:port" (which allows "sub.domain:port" and
	// "*.sub.domain:port" at any depth, not "domain:port") or "ip:port".
	// Empty allows any; the single entry None allows none. Entries are
	// trimmed of spaces.
	Hosts []string
}

// FloorError is CheckFloor's error: every way a sandbox block is below the
// operator's floor, each naming the setting that would allow it.
type FloorError struct {
	Problems []string
}

func (e *FloorError) Error() string { return strings.Join(e.Problems, "; ") }

// modeRank orders the modes: a higher rank is a stronger sandbox.
func modeRank(mode string) int {
	switch mode {
	case SandboxStrict:
		return 2
	case SandboxStandard, "":
		return 1
	case SandboxOff:
		return 0
	}
	return -1
}

// ModeOrDefault returns the floor's mode, standard when unset.
func (f Floor) ModeOrDefault() string {
	if f.Mode == "" {
		return SandboxStandard
	}
	return f.Mode
}

// Validate reports every problem of the floor at once, each naming its
// setting.
func (f Floor) Validate() error {
	var errs []error
	if modeRank(f.Mode) < 0 {
		errs = append(errs, fmt.Errorf("%s=%q: want strict, standard or off", FloorSetting, f.Mode))
	}
	paths := entries(f.Paths)
	for _, p := range paths {
		switch {
		case p == None && len(paths) > 1:
			errs = append(errs, fmt.Errorf("%s: %q must be the only entry", AllowPathsSetting, None))
		case p == None:
		case !strings.HasPrefix(p, "/") || cleanPath(p) != p:
			errs = append(errs, fmt.Errorf("%s: %q must be a clean absolute path (or the single entry %q)", AllowPathsSetting, p, None))
		}
	}
	hosts := entries(f.Hosts)
	for _, h := range hosts {
		switch {
		case h == None && len(hosts) > 1:
			errs = append(errs, fmt.Errorf("%s: %q must be the only entry", AllowHostsSetting, None))
		case h == None:
		default:
			if _, err := ParseDestination(h); err != nil {
				errs = append(errs, fmt.Errorf("%s: %v", AllowHostsSetting, err))
			}
		}
	}
	return errors.Join(errs...)
}

// CheckFloor reports whether the sandbox block is at or above the
// operator's floor: its mode no weaker than f's, every read_paths and
// write_paths entry under one of f's paths, every network.allow entry
// within one of f's hosts. The error is a *FloorError naming, for each
// problem, the field and the setting that would allow it. f must be valid
// (Floor.Validate); the block's own entries must be valid (Validate), and
// an invalid entry is reported as not allowed.
func (s Sandbox) CheckFloor(f Floor) error {
	var problems []string
	if mode, floor := s.ModeOrDefault(), f.ModeOrDefault(); modeRank(mode) < modeRank(floor) {
		problems = append(problems, fmt.Sprintf("sandbox.mode %q is below the operator's floor %q (%s)", mode, floor, FloorSetting))
	}
	paths := entries(f.Paths)
	for _, field := range []struct {
		name  string
		paths []string
	}{{"sandbox.read_paths", s.ReadPaths}, {"sandbox.write_paths", s.WritePaths}} {
		for _, p := range field.paths {
			if !pathAllowed(paths, p) {
				problems = append(problems, fmt.Sprintf("%s %q is not under a path the operator allows (%s=%s)", field.name, p, AllowPathsSetting, setting(paths)))
			}
		}
	}
	hosts := entries(f.Hosts)
	for _, a := range s.Network.Allow {
		if !hostAllowed(hosts, a) {
			problems = append(problems, fmt.Sprintf("sandbox.network.allow %q is not a destination the operator allows (%s=%s)", a, AllowHostsSetting, setting(hosts)))
		}
	}
	if len(problems) > 0 {
		return &FloorError{Problems: problems}
	}
	return nil
}

// entries trims a setting's entries and drops empty ones.
func entries(list []string) []string {
	var out []string
	for _, e := range list {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// setting shows a list setting's value as an operator would write it.
func setting(list []string) string {
	if len(list) == 0 {
		return `""`
	}
	return strings.Join(list, ",")
}

func pathAllowed(prefixes []string, p string) bool {
	if len(prefixes) == 0 {
		return true
	}
	if !strings.HasPrefix(p, "/") || cleanPath(p) != p {
		return false
	}
	for _, pre := range prefixes {
		if pre == None {
			return false
		}
		if p == pre || pre == "/" || strings.HasPrefix(p, pre+"/") {
			return true
		}
	}
	return false
}

func hostAllowed(patterns []string, entry string) bool {
	if len(patterns) == 0 {
		return true
	}
	d, err := ParseDestination(entry)
	if err != nil {
		return false
	}
	for _, p := range patterns {
		if p == None {
			return false
		}
		if op, err := ParseDestination(p); err == nil && op.covers(d) {
			return true
		}
	}
	return false
}

// cleanPath is path.Clean for slash-separated absolute paths, so the check
// is the same on every platform.
func cleanPath(p string) string {
	var out []string
	for seg := range strings.SplitSeq(p, "/") {
		switch seg {
		case "", ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, seg)
		}
	}
	return "/" + strings.Join(out, "/")
}

// MaxNetworkAllow bounds the entries of sandbox.network.allow.
const MaxNetworkAllow = 256

// validate appends the problems of sandbox.network.allow: each entry must
// be one the egress proxy reads.
func (n Network) validate(bad func(field, format string, a ...any)) {
	if len(n.Allow) > MaxNetworkAllow {
		bad("sandbox.network.allow", "has %d entries; the limit is %d", len(n.Allow), MaxNetworkAllow)
	}
	for _, a := range n.Allow {
		if _, err := ParseDestination(a); err != nil {
			bad("sandbox.network.allow", "%v", err)
		}
	}
}

// Destination is one sandbox.network.allow entry, parsed: how the
// operator's floor compares entries and the egress proxy matches them
// (docs/sandbox.md, "Egress proxy").
type Destination struct {
	Name     string     // lower-case host name, or the domain of a wildcard
	Addr     netip.Addr // set instead of Name for an IP literal (IPv4-mapped unmapped)
	Wildcard bool       // Name's subdomains, at any depth, not Name itself
	Port     uint16
}

// covers reports whether d, an operator's pattern, allows every
// destination e allows.
func (d Destination) covers(e Destination) bool {
	switch {
	case d.Port != e.Port:
		return false
	case d.Addr.IsValid() || e.Addr.IsValid():
		return d.Addr.IsValid() && e.Addr == d.Addr
	case d.Wildcard:
		return e.Name == d.Name && e.Wildcard || strings.HasSuffix(e.Name, "."+d.Name)
	}
	return !e.Wildcard && e.Name == d.Name
}

// ParseDestination reads "host:port", "*.domain:port" or "ip:port" (an
// IPv6 address in brackets). The port is a number from 1 to 65535; a host
// name is ASCII letters, digits, '-' and '_' in dot-separated labels, kept
// in lower case without a trailing dot; "*" stands only as the first label
// of a domain of two labels or more.
func ParseDestination(s string) (Destination, error) {
	bad := func(why string) (Destination, error) {
		return Destination{}, fmt.Errorf("%q: %s (want host:port, *.domain:port or ip:port)", s, why)
	}
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return bad("missing port")
		}
		return bad("not host:port")
	}
	if portStr == "" {
		return bad("missing port")
	}
	n, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || n == 0 {
		return bad(fmt.Sprintf("port %q is not a number from 1 to 65535", portStr))
	}
	port := uint16(n)
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		if _, err := netip.ParseAddr(rest); err == nil {
			return bad("a wildcard needs a domain, not an address")
		}
		name, err := HostName(rest)
		if err != nil {
			return bad(err.Error())
		}
		if !strings.Contains(name, ".") {
			return bad("a wildcard needs a domain with at least two labels")
		}
		return Destination{Name: name, Wildcard: true, Port: port}, nil
	}
	if strings.Contains(host, "*") {
		return bad(`"*" is allowed only as the first label ("*.example.com")`)
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.Zone() != "" {
			return bad("an address with a zone")
		}
		return Destination{Addr: addr.Unmap(), Port: port}, nil
	}
	name, err := HostName(host)
	if err != nil {
		return bad(err.Error())
	}
	return Destination{Name: name, Port: port}, nil
}

// HostName checks a DNS host name (ASCII letters, digits, '-' and '_' in
// dot-separated labels) and returns it in lower case without a trailing
// dot.
func HostName(s string) (string, error) {
	s = strings.TrimSuffix(s, ".")
	switch {
	case s == "":
		return "", errors.New("empty host")
	case len(s) > 253:
		return "", errors.New("host longer than 253 characters")
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" {
			return "", fmt.Errorf("host %q has an empty label", s)
		}
		if len(label) > 63 {
			return "", fmt.Errorf("host %q has a label longer than 63 characters", s)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("host %q has a character other than letters, digits, '-' and '_'", s)
			}
		}
	}
	return strings.ToLower(s), nil
}
