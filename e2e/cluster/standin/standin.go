// Package standin is the test kit that runs in Istio-injected pods in place
// of the images a machine without a registry cannot pull: standin-proxy
// stands in for Envoy in the istio-proxy container, standin-app for the
// application, and pause for the sandbox image. (The istio-validation init
// container needs no stand-in: it runs Istio's real pilot-agent.)
//
// Both stand-ins print one JSON Event per line on stdout, so a test reads
// what happened from `kubectl logs` with ParseEvents:
//
//   - every TCP server (the proxy's 15001 and 15006, the app's ports)
//     answers each connection with one JSON Reply line naming the pod, the
//     listener and the connection's original destination, closes it, and
//     logs an "accepted" event with the same facts; except the proxy's
//     15001 with -forward, which relays each connection to its original
//     destination, as Envoy does, and logs where from (ForwardFrom);
//   - every dialer connects to its targets periodically and logs a "dialed"
//     event holding the Reply of whoever answered (or "dial_failed"), so the
//     dialing side sees where its connection landed: its own proxy's
//     outbound-15001 when captured (with -forward: whoever answers at the
//     original destination), the destination's app-<port> when not
//     captured, the destination's inbound-15006 when the destination
//     captured it.
//
// The package owns the wire format and the servers and dialers; the
// programs under cmd/ only parse flags and compose them. It never logs on
// its own: each server and dialer reports through the Log it is given.
package standin

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Listener names, as they appear in Event.Listener and Reply.Listener. They
// match the names the project's netns harness gives its listeners.
const (
	ListenerOutbound = "outbound-15001"
	ListenerInbound  = "inbound-15006"
	ListenerDNS      = "dns-15053"
)

// AppListener names an application listener on port.
func AppListener(port uint16) string { return fmt.Sprintf("app-%d", port) }

// Kinds of Event.
const (
	// EventListening: a server is up (Listener, Local, Proto).
	EventListening = "listening"
	// EventAccepted: a server answered a connection or datagram (Listener,
	// Orig, Local, Peer, Proto).
	EventAccepted = "accepted"
	// EventDialed: a dialer reached Target and read its Reply.
	EventDialed = "dialed"
	// EventDialFailed: a dialer could not reach Target or read a Reply
	// (Error says which).
	EventDialFailed = "dial_failed"
	// EventReady: every server of the program is up; for the proxy, its
	// readiness endpoint answers 200 from now on.
	EventReady = "ready"
	// EventHTTP: the proxy's health or status port served a request
	// (Listener, Target holds "METHOD path", Peer).
	EventHTTP = "http"
	// EventStopping: the program got SIGTERM or SIGINT and exits 0.
	EventStopping = "stopping"
)

// Reply is what every stand-in server sends back: one JSON line over TCP,
// one datagram over UDP.
type Reply struct {
	// Pod is the answering pod's name (its hostname).
	Pod string `json:"pod"`
	// Listener names the server: ListenerOutbound, ListenerInbound,
	// ListenerDNS or AppListener(port).
	Listener string `json:"listener"`
	// Orig is where the connection was going before any redirect: the
	// SO_ORIGINAL_DST conntrack reports (after a REDIRECT, the destination
	// before it; after TPROXY, the local address). Empty for UDP.
	Orig string `json:"orig,omitempty"`
	// Local is the address the accepted socket is bound to.
	Local string `json:"local"`
	// Peer is the sender as the server sees it.
	Peer string `json:"peer"`
}

// Event is one line of a stand-in's stdout.
type Event struct {
	Time  time.Time `json:"time"`
	Prog  string    `json:"prog"` // "proxy" or "app"
	Pod   string    `json:"pod"`
	Event string    `json:"event"`
	// UID and GID are the program's identity, on "listening", "ready" and
	// dialer events: the netfilter owner match sees them.
	UID      *int   `json:"uid,omitempty"`
	GID      *int   `json:"gid,omitempty"`
	Proto    string `json:"proto,omitempty"` // "tcp" or "udp"
	Listener string `json:"listener,omitempty"`
	Orig     string `json:"orig,omitempty"`
	Local    string `json:"local,omitempty"`
	Peer     string `json:"peer,omitempty"`
	Target   string `json:"target,omitempty"`
	// ForwardFrom is, on a forwarding listener's "accepted" event, the
	// local address of the connection it opened to Orig: the peer the
	// destination saw, where no NAT lies between.
	ForwardFrom string `json:"forward_from,omitempty"`
	Reply       *Reply `json:"reply,omitempty"`
	Error       string `json:"error,omitempty"`
	// Args are the arguments a program ignored ("ready" event of the
	// proxy: the injected Envoy arguments).
	Args []string `json:"args,omitempty"`
	// TookMS is how long a dial took, connect to reply, in milliseconds.
	TookMS float64 `json:"took_ms,omitempty"`
}

// Log writes Events as JSON lines, safe for concurrent use.
type Log struct {
	mu   sync.Mutex
	w    io.Writer
	prog string
	pod  string
	now  func() time.Time
}

// NewLog returns a Log for program prog in pod that writes to w.
func NewLog(w io.Writer, prog, pod string) *Log {
	return &Log{w: w, prog: prog, pod: pod, now: time.Now}
}

// Pod is the pod name the Log stamps on every event.
func (l *Log) Pod() string { return l.pod }

// Emit stamps e with time, program and pod, and writes it as one line.
// Write errors are dropped: stdout going away must not stop a server.
func (l *Log) Emit(e Event) {
	e.Time = l.now().UTC()
	e.Prog = l.prog
	e.Pod = l.pod
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(append(b, '\n'))
}

// Identity returns the process's UID and GID, for Event.UID and Event.GID.
func Identity() (uid, gid *int) {
	u, g := os.Getuid(), os.Getgid()
	return &u, &g
}

// PodName is the name a stand-in reports as its pod: the hostname, which
// Kubernetes sets to the pod's name.
func PodName() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown"
	}
	return h
}

// ParseEvents reads a stand-in's output (for example `kubectl logs`) and
// returns its events in order. Lines that are not JSON objects (a runtime's
// own messages, a panic) are skipped; a line that starts like an object but
// is not a valid Event is an error naming its line number.
func ParseEvents(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var e Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return out, fmt.Errorf("parsing stand-in event on line %d %s: %w", n, quote.ValueN(line, 120), err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("reading stand-in events: %w", err)
	}
	return out, nil
}
