package egress

import (
	"net"
	"net/netip"
)

var (
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")      // RFC 791: "this host on this network"; Linux connects it locally
	cgnat       = netip.MustParsePrefix("100.64.0.0/10")  // RFC 6598 shared address space
	reserved4   = netip.MustParsePrefix("240.0.0.0/4")    // RFC 1112 reserved, and the broadcast address
	compat6     = netip.MustParsePrefix("::/96")          // deprecated IPv4-compatible IPv6
	siteLocal6  = netip.MustParsePrefix("fec0::/10")      // deprecated site-local
	nat64       = netip.MustParsePrefix("64:ff9b::/96")   // RFC 6052 well-known NAT64 prefix: the IPv4 address it embeds decides
	nat64Local  = netip.MustParsePrefix("64:ff9b:1::/48") // RFC 8215 local-use NAT64

	// IANA's special-purpose address registries (RFC 6890 and later)
	// whose blocks are not globally reachable: documentation, benchmarking,
	// protocol assignments, relays and discard. None is a destination a
	// run needs, and a host may give itself such an address (a container
	// bridge on 198.18.0.0/15, say) that the loopback and private checks
	// do not cover.
	specialPurpose = []netip.Prefix{
		netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
		netip.MustParsePrefix("192.0.2.0/24"),    // TEST-NET-1
		netip.MustParsePrefix("192.88.99.0/24"),  // 6to4 relay anycast (deprecated)
		netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
		netip.MustParsePrefix("198.51.100.0/24"), // TEST-NET-2
		netip.MustParsePrefix("203.0.113.0/24"),  // TEST-NET-3
		netip.MustParsePrefix("100::/64"),        // discard-only
		netip.MustParsePrefix("2001::/23"),       // IETF protocol assignments (Teredo, benchmarking, ORCHID)
		netip.MustParsePrefix("2001:db8::/32"),   // documentation
		netip.MustParsePrefix("2002::/16"),       // 6to4
		netip.MustParsePrefix("3fff::/20"),       // documentation (RFC 9637)
		netip.MustParsePrefix("5f00::/16"),       // SRv6 SIDs
	}
)

// own reports whether a is one of this host's interface addresses, as
// they are now (read at every check: a connection is checked once, and an
// address added to the host is covered from that moment): a destination
// that is the worker's host itself, in whatever range, is refused, or a
// run could reach the host's services (NATS among them) through an address
// the range checks allow.
// When the host's addresses cannot be read, every address counts as the
// host's: the check fails closed.
func own(a netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true
	}
	for _, ad := range addrs {
		if n, ok := ad.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
				return true
			}
		}
	}
	return false
}

// Refused names the class of a destination address the proxy refuses
// unless AllowPrivate is set ("loopback", "private", …), or returns "" for
// one it may dial. Doors that POST to URLs their callers name apply the
// same rule (docs/a2a.md, "Push notifications").
func Refused(a netip.Addr) string { return refusal(a) }

// refusal names the class of a destination address the proxy refuses unless
// AllowPrivate is set, or returns "" for an address it may dial.
func refusal(a netip.Addr) string {
	a = a.Unmap()
	if nat64.Contains(a) {
		b := a.As16()
		return refusal(netip.AddrFrom4([4]byte(b[12:])))
	}
	switch {
	case !a.IsValid():
		return "invalid"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	case a.IsPrivate(), siteLocal6.Contains(a), nat64Local.Contains(a):
		return "private"
	case cgnat.Contains(a):
		return "carrier-grade NAT"
	case thisNetwork.Contains(a), reserved4.Contains(a), compat6.Contains(a):
		return "reserved"
	}
	for _, p := range specialPurpose {
		if p.Contains(a) {
			return "special-purpose (" + p.String() + ")"
		}
	}
	if own(a) {
		return "this host's own address"
	}
	return ""
}
