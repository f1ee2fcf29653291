// Package egress is the egress gateway of a run whose network is "policy"
// (docs/sandbox.md, "Network"): the run's only way out.
//
// The run has its own network namespace, and one of two captures brings
// every TCP connection it makes, to any address and port, and every DNS
// query, to any server, to the gateway: the kernel capture (kernel.go:
// nftables rules of the run's namespace rewrite them to two sockets the
// sandbox's init hands over) or the netstack capture (netstack.go: a veth
// pair whose far end is an AF_PACKET socket served by gVisor's tcpip
// stack). Nothing is routed: a connection reaches a host only when the
// gateway has decided it and dialled the host itself.
//
//   - The run's resolver (any server, port 53) answers every name with an
//     address of its own (198.18.0.0/16), which stands for that name; no
//     query leaves the run.
//   - A connection is decided on the name (or the literal address) and the
//     port, and on the protocol its first bytes show: `http` (a request),
//     `https` (a TLS client hello, whose SNI must name the decided host) or
//     `tcp`. For `http` each request is decided on its own, with its method
//     and normalised path, and forwarded with exactly that path.
//   - The proxy at GatewayAddr:ProxyPort serves programs that honour proxy
//     variables (CONNECT, and absolute-form plain HTTP), with the same
//     decisions.
//   - Only an allowed name is resolved, by the daemon; an address that is
//     loopback, link-local, private, multicast, unspecified or the host's
//     own is never dialled unless Config.Reach admits it.
//   - Recheck decides every open connection again and cuts the refused ones
//     before it returns (a context switch, a reload).
//
// Fail-closed choices: anything the gateway cannot parse or classify is
// refused; an unknown address of the name range is reset; HTTP upgrades
// and CONNECT inside a captured connection are refused; a decision the
// Decider cannot make is a deny.
package egress
