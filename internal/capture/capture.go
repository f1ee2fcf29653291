// Package capture names the ways a run's connections reach its egress
// gateway, spelled once for the sandbox that builds them and the gateway
// that serves them.
package capture

const (
	Auto     = ""         // kernel where the kernel has nftables NAT, else netstack
	Kernel   = "kernel"   // nftables in the run's namespace, kernel TCP both ways
	Netstack = "netstack" // a veth pair, the gateway's own stack on a packet socket
)
