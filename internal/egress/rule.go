package egress

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/agora-dispatch/agora/pkg/subagent"
)

// Rule is one entry of the allow-list: a destination a run may reach. It is
// built by [ParseRule]; the zero Rule matches nothing.
type Rule struct {
	d subagent.Destination
}

// ParseRule parses one allow-list entry, as sandbox.network.allow writes
// it (subagent.ParseDestination):
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
	if strings.TrimSpace(s) == "" {
		return Rule{}, fmt.Errorf("egress: rule %q: empty (want host:port, *.domain:port or ip:port)", s)
	}
	d, err := subagent.ParseDestination(s)
	if err != nil {
		return Rule{}, fmt.Errorf("egress: rule %w", err)
	}
	return Rule{d: d}, nil
}

// Match reports whether the rule allows host (a name or an IP literal,
// without brackets) on port.
func (r Rule) Match(host string, port int) bool {
	if port < 1 || port > 65535 || uint16(port) != r.d.Port {
		return false
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		return r.d.Addr.IsValid() && addr.Zone() == "" && addr.Unmap() == r.d.Addr
	}
	name, err := subagent.HostName(host)
	if err != nil {
		return false
	}
	return r.matchName(name)
}

// matchName matches a normalized host name.
func (r Rule) matchName(name string) bool {
	switch {
	case r.d.Name == "":
		return false
	case r.d.Wildcard:
		return strings.HasSuffix(name, "."+r.d.Name)
	default:
		return name == r.d.Name
	}
}

// String returns the rule in the form ParseRule reads.
func (r Rule) String() string {
	switch {
	case r.d.Addr.IsValid():
		return netip.AddrPortFrom(r.d.Addr, r.d.Port).String()
	case r.d.Wildcard:
		return "*." + r.d.Name + ":" + strconv.Itoa(int(r.d.Port))
	default:
		return r.d.Name + ":" + strconv.Itoa(int(r.d.Port))
	}
}
