package cluster

import (
	"context"
	"net"
	"os"

	"github.com/nftmesh/nftmesh/internal/hostns"
)

// netnsDialer opens TCP connections from inside the holder's network
// namespace, so the test process itself (in the machine's namespace) can
// talk to the apiserver, kubelet and pods without any route or forwarder in
// the machine's namespace. A socket keeps the namespace it was created in,
// so only socket creation needs the switched thread (hostns.Do).
type netnsDialer struct {
	ns *os.File // /proc/<holder>/ns/net, held open while the cluster runs
}

func (d *netnsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	n, err := hostns.Borrow(int(d.ns.Fd()), d.ns.Name())
	if err != nil {
		return nil, err
	}
	var conn net.Conn
	err = n.Do(func() error {
		var dialer net.Dialer
		var derr error
		conn, derr = dialer.DialContext(ctx, network, addr)
		return derr
	})
	return conn, err
}
