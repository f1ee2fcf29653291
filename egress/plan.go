package egress

import (
	"net"
	"net/netip"
	"strconv"
)

// The run's network, as the sandbox's init builds it and the gateway serves
// it. 198.18.0.0/15 is reserved for benchmarking (RFC 2544): no host the
// run could mean lives there.
var (
	// GatewayAddr is the gateway's address: the run's next hop, resolver
	// and proxy.
	GatewayAddr = netip.AddrFrom4([4]byte{198, 19, 0, 1})
	// RunAddr is the run's own address.
	RunAddr = netip.AddrFrom4([4]byte{198, 19, 0, 2})
	// GatewayMAC is the hardware address of the gateway's end of the pair.
	GatewayMAC = net.HardwareAddr{0x02, 0x63, 0x64, 0x66, 0x73, 0x01}
	// nameRange holds the addresses the resolver gives names (the whole
	// plan, 198.18.0.0/15, is never dialled: refusedRanges).
	nameRange = netip.MustParsePrefix("198.18.0.0/16")
)

const (
	// ProxyPort is where the gateway's HTTP proxy listens.
	ProxyPort = 3128
	// MTU of both ends of the pair. Below the largest packet the link's
	// reader takes (64 KiB less its headers), with the run's segmentation
	// offload capped at it too.
	MTU = 65000
)

// ProxyEnv is the proxy variables of a run's environment.
func ProxyEnv() []string {
	p := "http://" + GatewayAddr.String() + ":" + strconv.Itoa(ProxyPort)
	var env []string
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
		env = append(env, k+"="+p)
	}
	return append(env, "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1")
}
