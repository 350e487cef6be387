package netlab

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/serve"
	"github.com/nftmesh/nftmesh/internal/sockopt"
	"github.com/nftmesh/nftmesh/redirect"
)

// Names of the pod's proxy listeners, as they appear in Reply.Listener and
// Result.Landed.
var (
	ListenerOutbound = fmt.Sprintf("outbound-%d", redirect.ProxyOutboundPort)
	ListenerInbound  = fmt.Sprintf("inbound-%d", redirect.ProxyInboundPort)
	ListenerDNS      = fmt.Sprintf("dns-%d", redirect.DNSProxyPort)
)

// AppListener names the pod's app listener on port.
func AppListener(port uint16) string { return fmt.Sprintf("app-%d", port) }

// PeerListener names a peer listener by the address the connection reached.
func PeerListener(dst netip.AddrPort) string { return "peer:" + dst.String() }

// ioTimeout bounds every read and write, so a probe whose packets are
// swallowed fails fast instead of hanging.
const ioTimeout = 2 * time.Second

// Reply is what every listener sends back: one JSON line over TCP, one
// datagram over UDP.
type Reply struct {
	// Listener is the listener's name: ListenerOutbound, ListenerInbound,
	// ListenerDNS, AppListener(port) or PeerListener(addr:port).
	Listener string `json:"listener"`
	// Orig is the connection's original destination: SO_ORIGINAL_DST for
	// TCP (the NAT-free destination when no NAT applied), the conntrack
	// entry's original tuple for UDP, else the local address (TPROXY: the
	// local address is the original destination).
	Orig string `json:"orig"`
	// Local is the address the accepting socket is bound to, after NAT.
	Local string `json:"local"`
	// Peer is the sender as the listener sees it.
	Peer string `json:"peer"`
}

// ListenerOptions shape StartListeners.
type ListenerOptions struct {
	// ProxyUID / ProxyGID own the DNS proxy's sockets, as the istio-agent's
	// UID/GID own its real ones: the raw-table rules that put the proxy's
	// DNS replies into the app's conntrack zone match on them. In-pod IDs
	// (see TopologyOptions.PodUIDBase); zero means redirect.DefaultProxyID.
	ProxyUID, ProxyGID uint32
}

// Listeners are the running listeners of a topology.
type Listeners struct{ group serve.Group }

// StartListeners starts, in the pod: TCP 15001 (outbound), 15006 (inbound,
// transparent so TPROXY can hand it connections), TCP+UDP 15053 (DNS proxy),
// TCP on every app port; in the peer: TCP on every PeerTCPPorts and UDP on
// every PeerUDPPorts port, on all its addresses. IPv4 and IPv6 each get their
// own socket. On error the listeners started so far are closed.
func StartListeners(t *Topology, opts ListenerOptions) (_ *Listeners, err error) {
	opts.ProxyUID = cmp.Or(opts.ProxyUID, redirect.DefaultProxyID)
	opts.ProxyGID = cmp.Or(opts.ProxyGID, redirect.DefaultProxyID)
	l := &Listeners{}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	type spec struct {
		ns          string
		name        string // "" = peer (named per connection)
		port        uint16
		udp         bool
		transparent bool
		owner       *creds
	}
	pod, peer := t.PodNetnsPath(), t.PeerNetnsPath()
	proxy := t.hostCreds(opts.ProxyUID, opts.ProxyGID)
	specs := []spec{
		{ns: pod, name: ListenerOutbound, port: redirect.ProxyOutboundPort},
		{ns: pod, name: ListenerInbound, port: redirect.ProxyInboundPort, transparent: true},
		{ns: pod, name: ListenerDNS, port: redirect.DNSProxyPort, owner: proxy},
		{ns: pod, name: ListenerDNS, port: redirect.DNSProxyPort, udp: true, owner: proxy},
	}
	for _, p := range t.AppPorts {
		specs = append(specs, spec{ns: pod, name: AppListener(p), port: p})
	}
	for _, p := range t.PeerTCPPorts {
		specs = append(specs, spec{ns: peer, port: p})
	}
	for _, p := range t.PeerUDPPorts {
		specs = append(specs, spec{ns: peer, port: p, udp: true})
	}
	for _, s := range specs {
		for _, v6 := range []bool{false, true} {
			var err error
			if s.udp {
				err = l.startUDP(s.ns, s.name, s.port, v6, s.owner)
			} else {
				err = l.startTCP(s.ns, s.name, s.port, v6, s.transparent, s.owner)
			}
			if err != nil {
				return nil, err
			}
		}
	}
	return l, nil
}

// Close stops every listener and waits for their goroutines.
func (l *Listeners) Close() error { return l.group.Close() }

func network(base string, v6 bool) (string, string) {
	if v6 {
		return base + "6", "[::]"
	}
	return base + "4", "0.0.0.0"
}

func (l *Listeners) startTCP(ns, name string, port uint16, v6, transparent bool, owner *creds) error {
	netw, host := network("tcp", v6)
	addr := fmt.Sprintf("%s:%d", host, port)
	var ln *net.TCPListener
	err := inNetns(ns, owner, func() error {
		// Listened to by address, not by string (see dial), with
		// IP_TRANSPARENT set once listening: TPROXY checks it on the
		// listener each time it hands one a connection.
		var err error
		if ln, err = net.ListenTCP(netw, &net.TCPAddr{Port: int(port)}); err != nil || !transparent {
			return err
		}
		rc, err := ln.SyscallConn()
		if err == nil {
			err = sockopt.Transparent(netw, addr, rc)
		}
		if err != nil {
			ln.Close()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("listening on %s %s in %s: %w", netw, addr, ns, err)
	}
	l.group.Add(ln.Close)
	l.group.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.group.Go(func() { serveTCP(c.(*net.TCPConn), name) })
		}
	})
	return nil
}

func serveTCP(c *net.TCPConn, name string) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	local := sockopt.AddrPort(c.LocalAddr())
	orig, err := sockopt.Destination(c)
	if err != nil {
		orig = local
	}
	b, _ := json.Marshal(Reply{Listener: cmp.Or(name, PeerListener(local)), Orig: orig.String(), Local: local.String(), Peer: sockopt.AddrPort(c.RemoteAddr()).String()})
	_, _ = c.Write(append(b, '\n'))
}

func (l *Listeners) startUDP(ns, name string, port uint16, v6 bool, owner *creds) error {
	netw, host := network("udp", v6)
	addr := fmt.Sprintf("%s:%d", host, port)
	var pc *net.UDPConn
	err := inNetns(ns, owner, func() error {
		// PKTINFO tells each datagram's destination, which replies are
		// sent from (see serve.AnswerDatagrams); asked for before the
		// first probe can arrive.
		var err error
		if pc, err = net.ListenUDP(netw, &net.UDPAddr{Port: int(port)}); err != nil {
			return err
		}
		rc, err := pc.SyscallConn()
		if err == nil {
			err = sockopt.RecvPktinfo(netw, addr, rc)
		}
		if err != nil {
			pc.Close()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("listening on %s %s in %s: %w", netw, addr, ns, err)
	}
	ct, err := handleAt(ns)
	if err != nil {
		pc.Close()
		return err
	}
	l.group.Add(func() error { err := pc.Close(); ct.Close(); return err })
	l.group.Go(func() { serveUDP(pc, ct, name, port, v6) })
	return nil
}

func serveUDP(c *net.UDPConn, ct *netlink.Handle, name string, port uint16, v6 bool) {
	serve.AnswerDatagrams(c, ioTimeout, func(dst netip.Addr, from netip.AddrPort) []byte {
		local := netip.AddrPortFrom(dst, port)
		orig, ok := conntrackOrig(ct, v6, local, from)
		if !ok {
			orig = local
		}
		b, _ := json.Marshal(Reply{Listener: cmp.Or(name, PeerListener(local)), Orig: orig.String(), Local: local.String(), Peer: from.String()})
		return b
	}, nil)
}

// conntrackOrig finds the original destination of the UDP flow whose reply
// direction runs local → from. UDP has no SO_ORIGINAL_DST on an unconnected
// socket; conntrack still knows.
func conntrackOrig(h *netlink.Handle, v6 bool, local, from netip.AddrPort) (netip.AddrPort, bool) {
	fam := netlink.InetFamily(unix.AF_INET)
	if v6 {
		fam = unix.AF_INET6
	}
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
	if err != nil {
		return netip.AddrPort{}, false
	}
	for _, f := range flows {
		r := f.Reverse
		if f.Forward.Protocol != unix.IPPROTO_UDP || r.SrcPort != local.Port() || r.DstPort != from.Port() {
			continue
		}
		rs, _ := netip.AddrFromSlice(r.SrcIP)
		rd, _ := netip.AddrFromSlice(r.DstIP)
		if rs.Unmap() != local.Addr() || rd.Unmap() != from.Addr() {
			continue
		}
		od, ok := netip.AddrFromSlice(f.Forward.DstIP)
		if !ok {
			continue
		}
		return netip.AddrPortFrom(od.Unmap(), f.Forward.DstPort), true
	}
	return netip.AddrPort{}, false
}
