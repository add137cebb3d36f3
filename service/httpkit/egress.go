package httpkit

import (
	"context"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/notifierhq/notifier/service/delivery"
)

// Egress is the policy for destinations that users supply (a webhook URL, a Web Push subscription's
// endpoint): without it, any user could make the worker call the machine's own admin ports, the cloud
// metadata service or the database host, and read part of the answer back from last_error.
//
// It is enforced by the dialer (net.Dialer.ControlContext): the check sees each IP address the
// dialer is about to connect to, after name resolution, so a name that resolves to a public address
// when a URL is checked and to an internal one when it is dialled (DNS rebinding) cannot pass. It
// runs after the socket is created and before connect(2): a refused address gets no packet at all.
// Redirects are never followed (see NewClient), and a transport with an Egress policy never goes
// through a forward proxy, which would dial the destination itself, out of the policy's sight.
//
// The zero value refuses every network of RefusedNetwork; Allowed opts networks back in.
type Egress struct {
	// Allowed are networks opted in although RefusedNetwork refuses them (a private receiver). An
	// IPv4-mapped IPv6 address (::ffff:a.b.c.d) is also matched by its IPv4 form.
	Allowed []netip.Prefix
}

// Loopback is 127.0.0.0/8 and ::1/128: the Allowed of a receiver on the worker's own machine.
var Loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// RefusedError is a destination the Egress policy refused: nothing was sent to it.
type RefusedError struct {
	Addr    netip.Addr
	Network string // RefusedNetwork's name for it
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("destination %s is in a refused network (%s); allowed_networks opts a network in", e.Addr, e.Network)
}

// Check returns a *RefusedError when addr is in a refused network that Allowed does not opt in.
func (e *Egress) Check(addr netip.Addr) error {
	addr = addr.WithZone("") // a prefix never contains a zoned address
	network := RefusedNetwork(addr)
	if network == "" {
		return nil
	}
	for _, p := range e.Allowed {
		if p.Contains(addr) || p.Contains(addr.Unmap()) {
			return nil
		}
	}
	return &RefusedError{Addr: addr, Network: network}
}

// control is the dialer's ControlContext: address is the IP and port being connected to.
func (e *Egress) control(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil { // never expected from a TCP dial; refuse what cannot be read
		return &RefusedError{Network: "unreadable address " + fmt.Sprintf("%q", address)}
	}
	return e.Check(ap.Addr())
}

type namedPrefix struct {
	prefix netip.Prefix
	name   string
}

func named(cidr, name string) namedPrefix { return namedPrefix{netip.MustParsePrefix(cidr), name} }

// refusedV4 are the IPv4 special-purpose blocks (IANA's registry, RFC 6890 and its updates) that a
// user-supplied destination must never reach: not globally reachable, or not a unicast host.
// The most specific block comes first.
var refusedV4 = []namedPrefix{
	named("0.0.0.0/8", "unspecified"), // "this network": Linux connects 0.0.0.0 to the local host
	named("10.0.0.0/8", "private"),
	named("100.64.0.0/10", "CGNAT"),
	named("127.0.0.0/8", "loopback"),
	named("169.254.0.0/16", "link-local"), // includes 169.254.169.254, the cloud metadata service
	named("172.16.0.0/12", "private"),
	named("192.0.0.0/24", "IETF protocol assignments"),
	named("192.0.2.0/24", "documentation"),
	named("192.88.99.0/24", "6to4 relay anycast"),
	named("192.168.0.0/16", "private"),
	named("198.18.0.0/15", "benchmarking"),
	named("198.51.100.0/24", "documentation"),
	named("203.0.113.0/24", "documentation"),
	named("224.0.0.0/4", "multicast"),
	named("255.255.255.255/32", "broadcast"),
	named("240.0.0.0/4", "reserved"),
}

// refusedV6 are the IPv6 ones. IPv4-mapped addresses (::ffff:0:0/96) are classified by their IPv4
// form, and so are the IPv4 addresses embedded in NAT64 (64:ff9b::/96) and 6to4 (2002::/16)
// addresses, which translators and relays reach on the worker's behalf.
var refusedV6 = []namedPrefix{
	named("::/128", "unspecified"),
	named("::1/128", "loopback"),
	named("::/96", "IPv4-compatible"), // deprecated (RFC 4291): ::a.b.c.d
	named("64:ff9b:1::/48", "local-use NAT64"),
	named("100::/64", "discard-only"),
	named("2001::/32", "Teredo"),
	named("2001:2::/48", "benchmarking"),
	named("2001:db8::/32", "documentation"),
	named("fc00::/7", "private"), // unique local addresses
	named("fe80::/10", "link-local"),
	named("fec0::/10", "site-local"), // deprecated, still routed inside some networks
	named("ff00::/8", "multicast"),
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// RefusedNetwork names the refused network addr is in ("loopback", "private", "link-local", ...),
// or returns "" for an address the Egress policy lets through by default. It only classifies: it
// never resolves or connects.
func RefusedNetwork(addr netip.Addr) string {
	addr = addr.WithZone("")
	if !addr.IsValid() {
		return "invalid"
	}
	if addr.Is4In6() {
		return within(refusedV4, addr.Unmap())
	}
	if addr.Is4() {
		return within(refusedV4, addr)
	}
	b := addr.As16()
	if nat64.Contains(addr) {
		return within(refusedV4, netip.AddrFrom4([4]byte(b[12:16])))
	}
	if sixToFour.Contains(addr) {
		return within(refusedV4, netip.AddrFrom4([4]byte(b[2:6])))
	}
	return within(refusedV6, addr)
}

func within(list []namedPrefix, addr netip.Addr) string {
	for _, n := range list {
		if n.prefix.Contains(addr) {
			return n.name
		}
	}
	return ""
}

// ParseNetworks reads CIDR networks ("10.1.2.0/24", "fd00::/8"), as a channel's allowed_networks.
// An address with host bits set under its mask is refused: it would allow more than it says.
func ParseNetworks(cidrs []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%w: %q is not a CIDR network such as \"10.1.2.0/24\" or \"fd00::/8\"", delivery.ErrInvalidInput, s)
		}
		if p.Addr().Zone() != "" {
			return nil, fmt.Errorf("%w: %q: a network has no zone", delivery.ErrInvalidInput, s)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("%w: %q has bits set beyond its /%d: did you mean %q?", delivery.ErrInvalidInput, s, p.Bits(), p.Masked().String())
		}
		out = append(out, p)
	}
	return out, nil
}

// IsLoopbackHost says whether host (a URL's or a listen address's host, without port or brackets) is
// "localhost" or a loopback IP: where plain HTTP, or SMTP without TLS, does not cross a network. It
// only classifies: it never resolves. An empty host (":8080") is every interface, not loopback.
func IsLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
