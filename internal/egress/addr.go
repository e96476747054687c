package egress

import "net/netip"

var (
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")      // RFC 791: "this host on this network"; Linux connects it locally
	cgnat       = netip.MustParsePrefix("100.64.0.0/10")  // RFC 6598 shared address space
	reserved4   = netip.MustParsePrefix("240.0.0.0/4")    // RFC 1112 reserved, and the broadcast address
	compat6     = netip.MustParsePrefix("::/96")          // deprecated IPv4-compatible IPv6
	siteLocal6  = netip.MustParsePrefix("fec0::/10")      // deprecated site-local
	nat64       = netip.MustParsePrefix("64:ff9b::/96")   // RFC 6052 well-known NAT64 prefix: the IPv4 address it embeds decides
	nat64Local  = netip.MustParsePrefix("64:ff9b:1::/48") // RFC 8215 local-use NAT64
)

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
	return ""
}
