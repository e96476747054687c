package egress

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Rule is one entry of the allow-list: a destination a run may reach. It is
// built by [ParseRule]; the zero Rule matches nothing.
type Rule struct {
	name     string     // lower-case host name, or the domain of a wildcard
	addr     netip.Addr // set instead of name for an IP literal
	wildcard bool       // name's subdomains, not name itself
	port     uint16
}

// ParseRule parses one allow-list entry:
//
//   - "host:port" allows exactly that host name on that port
//     ("api.anthropic.com:443");
//   - "*.domain:port" allows every subdomain of domain on that port, at any
//     depth ("*.githubusercontent.com:443" allows
//     "raw.githubusercontent.com" and "a.b.githubusercontent.com") but not
//     the apex "githubusercontent.com" itself: list it separately;
//   - "ip:port" or "[ipv6]:port" allows that address literal, compared as
//     an address ("[::ffff:203.0.113.7]:443" is "203.0.113.7:443"); a
//     wildcard never matches an address.
//
// Host names are matched case-insensitively and without a trailing dot. The
// port is required, a number from 1 to 65535. An allowed destination must
// still pass the private-address check ([Config.AllowPrivate]).
func ParseRule(s string) (Rule, error) {
	bad := func(why string) (Rule, error) {
		return Rule{}, fmt.Errorf("egress: rule %q: %s (want host:port or *.domain:port)", s, why)
	}
	if strings.TrimSpace(s) == "" {
		return bad("empty")
	}
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return bad("missing port")
		}
		return bad("not host:port")
	}
	port, err := parsePort(portStr)
	if err != nil {
		return bad(err.Error())
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		if _, err := netip.ParseAddr(rest); err == nil {
			return bad("a wildcard needs a domain, not an address")
		}
		name, err := normalizeName(rest)
		if err != nil {
			return bad(err.Error())
		}
		if !strings.Contains(name, ".") {
			return bad("a wildcard needs a domain with at least two labels")
		}
		return Rule{name: name, wildcard: true, port: port}, nil
	}
	if strings.Contains(host, "*") {
		return bad(`"*" is allowed only as the first label ("*.example.com")`)
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.Zone() != "" {
			return bad("an address with a zone")
		}
		return Rule{addr: addr.Unmap(), port: port}, nil
	}
	name, err := normalizeName(host)
	if err != nil {
		return bad(err.Error())
	}
	return Rule{name: name, port: port}, nil
}

// Match reports whether the rule allows host (a name or an IP literal,
// without brackets) on port.
func (r Rule) Match(host string, port int) bool {
	if port < 1 || port > 65535 || uint16(port) != r.port {
		return false
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		return r.addr.IsValid() && addr.Zone() == "" && addr.Unmap() == r.addr
	}
	name, err := normalizeName(host)
	if err != nil {
		return false
	}
	return r.matchName(name)
}

// matchName matches a normalized host name.
func (r Rule) matchName(name string) bool {
	switch {
	case r.name == "":
		return false
	case r.wildcard:
		return strings.HasSuffix(name, "."+r.name)
	default:
		return name == r.name
	}
}

// String returns the rule in the form ParseRule reads.
func (r Rule) String() string {
	switch {
	case r.addr.IsValid():
		return netip.AddrPortFrom(r.addr, r.port).String()
	case r.wildcard:
		return "*." + r.name + ":" + strconv.Itoa(int(r.port))
	default:
		return r.name + ":" + strconv.Itoa(int(r.port))
	}
}

func parsePort(s string) (uint16, error) {
	if s == "" {
		return 0, fmt.Errorf("missing port")
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q is not a number from 1 to 65535", s)
	}
	return uint16(n), nil
}

// normalizeName checks a DNS host name (ASCII letters, digits, '-' and '_'
// in dot-separated labels) and returns it in lower case without a trailing
// dot.
func normalizeName(s string) (string, error) {
	s = strings.TrimSuffix(s, ".")
	switch {
	case s == "":
		return "", fmt.Errorf("empty host")
	case len(s) > 253:
		return "", fmt.Errorf("host longer than 253 characters")
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
