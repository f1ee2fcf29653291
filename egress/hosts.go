package egress

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// HostsResolver resolves a name from the hosts(5) file at path (read at
// each call: it is small, and an edit applies at once), and from DNS when
// the file does not name it. A file that cannot be read fails the lookup:
// its names must not fall through to DNS. An empty path is DNS alone.
func HostsResolver(path string) func(ctx context.Context, host string) ([]netip.Addr, error) {
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		if path == "" {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
		addrs, err := lookupHosts(path, strings.TrimSuffix(host, "."))
		if err != nil {
			return nil, err
		}
		if len(addrs) > 0 {
			return addrs, nil
		}
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	}
}

func lookupHosts(path, host string) ([]netip.Addr, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("hosts file: %w", err)
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		a, err := netip.ParseAddr(fields[0])
		if err != nil {
			continue
		}
		for _, n := range fields[1:] {
			if canonicalName(n) == host {
				out = append(out, a.WithZone(""))
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("hosts file %s: %w", path, err)
	}
	return out, nil
}
