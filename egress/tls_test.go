package egress

import (
	"crypto/tls"
	"net"
)

func tlsClient(c net.Conn, name string) *tls.Conn {
	return tls.Client(c, &tls.Config{ServerName: name, InsecureSkipVerify: true})
}
