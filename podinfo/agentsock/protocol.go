// Package agentsock is the node-local question the CNI plugin asks the
// node agent before the API server: "what do you know of pod
// namespace/name with this UID?". The agent answers from its node's pod
// informer, so a pod start costs the control plane nothing.
//
// It owns the wire format (one length-prefixed JSON request and answer per
// connection, both bounded), the plugin's client, and the agent's server
// with the socket's place, permissions and peer check (root only, by
// SO_PEERCRED). It imports nothing from Kubernetes, so the plugin pays no
// client-go start-up; the agent answers through a Resolver
// (installer/podcache).
//
// An answer is the decision fields (meshpod.Pod) of exactly the UID asked
// about, or "unknown". "unknown" and every failure send the plugin to its
// own API lookup, which fails closed: the socket can make an ADD faster,
// never let a pod through without the decision the API would give.
package agentsock

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Version is the protocol version both sides speak; any other is refused.
const Version = 1

// Bounds on what either side reads. An answer carries a pod's labels,
// annotations and proxy args and env: the API server caps a whole object
// at about 1.5 MiB, so 2 MiB holds any real pod's decision fields.
const (
	MaxRequest = 4 << 10
	MaxAnswer  = 2 << 20
	// A namespace is a DNS label, a pod name a DNS subdomain; UIDs are
	// UUIDs (36 bytes), bounded loosely.
	maxNamespace = 63
	maxName      = 253
	maxUID       = 128
)

// Answer statuses: Pod holds the decision fields of the pod with UID, or
// the agent cannot answer for that UID (Reason says why) and the plugin
// asks the API server itself.
const (
	StatusFound   = "found"
	StatusUnknown = "unknown"
)

// Request asks about one pod, as kubelet names it in CNI_ARGS.
type Request struct {
	V         int    `json:"v"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// Answer is the agent's reply.
type Answer struct {
	V      int          `json:"v"`
	Status string       `json:"status"`
	Reason string       `json:"reason,omitempty"` // why unknown, for the plugin's log
	UID    string       `json:"uid,omitempty"`    // Pod's UID: the request's
	Pod    *meshpod.Pod `json:"pod,omitempty"`
}

// Unknown is an unknown answer with reason.
func Unknown(reason string) Answer {
	return Answer{V: Version, Status: StatusUnknown, Reason: quote.Text(reason)}
}

// Found is the answer for pod, whose UID is uid.
func Found(uid string, pod *meshpod.Pod) Answer {
	return Answer{V: Version, Status: StatusFound, UID: uid, Pod: pod}
}

// FieldError is a request or answer field with a value that is not
// acceptable; Value is quoted and bounded.
type FieldError struct {
	What   string // "request" or "answer"
	Field  string
	Value  string
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s field %s: %s %s", e.What, e.Field, quote.Value(e.Value), e.Reason)
}

// Validate checks the protocol version and that the names are ones a
// kubelet could pass (non-empty, within Kubernetes' lengths, printable).
// The UID is required: without it a cached pod cannot be told from an
// older one of the same name.
func (r Request) Validate() error {
	if r.V != Version {
		return &FieldError{"request", "v", fmt.Sprint(r.V), fmt.Sprintf("is not protocol version %d", Version)}
	}
	for _, f := range []struct {
		field, value string
		max          int
	}{{"namespace", r.Namespace, maxNamespace}, {"name", r.Name, maxName}, {"uid", r.UID, maxUID}} {
		if err := checkName("request", f.field, f.value, f.max); err != nil {
			return err
		}
	}
	return nil
}

func checkName(what, field, v string, max int) error {
	switch {
	case v == "":
		return &FieldError{what, field, v, "is empty"}
	case len(v) > max:
		return &FieldError{what, field, v, fmt.Sprintf("is longer than %d bytes", max)}
	case strings.IndexFunc(v, notNameChar) >= 0:
		return &FieldError{what, field, v, "holds a character no Kubernetes name or UID has"}
	}
	return nil
}

// notNameChar: Kubernetes names are lower-case DNS names, UIDs are UUIDs;
// allowing upper case and '_' too keeps the check about safety (no
// separators, no control or non-ASCII bytes), not about naming rules.
func notNameChar(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_')
}

// ErrWrongAnswer is wrapped by CheckAnswer's errors.
var ErrWrongAnswer = errors.New("not an answer to the request")

// CheckAnswer checks that a is a well-formed answer to req: the protocol
// version, a known status, and for a found pod the very namespace, name
// and UID asked about. An answer about another pod (a stale cache, a bug,
// a forged reply) is never used.
func CheckAnswer(req Request, a Answer) error {
	wrong := func(field, value, reason string) error {
		return fmt.Errorf("%w: %w", ErrWrongAnswer, &FieldError{"answer", field, value, reason})
	}
	if a.V != Version {
		return wrong("v", fmt.Sprint(a.V), fmt.Sprintf("is not protocol version %d", Version))
	}
	switch a.Status {
	case StatusUnknown:
		if a.Pod != nil || a.UID != "" {
			return wrong("status", a.Status, "comes with a pod")
		}
		return nil
	case StatusFound:
	default:
		return wrong("status", a.Status, "is not found or unknown")
	}
	switch {
	case a.Pod == nil:
		return wrong("pod", "", "is missing from a found answer")
	case a.UID != req.UID:
		return wrong("uid", a.UID, "is not the UID asked about ("+quote.Value(req.UID)+")")
	case a.Pod.Namespace != req.Namespace:
		return wrong("pod.Namespace", a.Pod.Namespace, "is not the namespace asked about ("+quote.Value(req.Namespace)+")")
	case a.Pod.Name != req.Name:
		return wrong("pod.Name", a.Pod.Name, "is not the name asked about ("+quote.Value(req.Name)+")")
	}
	return nil
}

// readRequest reads the one request of a connection, strictly.
func readRequest(r io.Reader) (Request, error) {
	b, err := readPayload(r, MaxRequest, "request")
	if err != nil {
		return Request{}, err
	}
	return decode[Request](b, "request")
}

// firstRead is the buffer of a frame's first read, which holds a usual
// answer whole: a frame already waiting takes one read.
const firstRead = 16 << 10

// readPayload reads one frame (a 4-byte big-endian length, then that many
// bytes, at most max) and returns its payload. Bytes after the frame are
// an error: one frame per connection, more is a sender to distrust.
func readPayload(r io.Reader, max int, what string) ([]byte, error) {
	buf := make([]byte, 4+min(max, firstRead))
	n, err := io.ReadAtLeast(r, buf, 4)
	if err != nil {
		return nil, fmt.Errorf("reading %s length: %w", what, noEOF(err))
	}
	l := binary.BigEndian.Uint32(buf)
	if l == 0 || l > uint32(max) {
		return nil, &FieldError{what, "length", fmt.Sprint(l), fmt.Sprintf("is not within 1..%d bytes", max)}
	}
	need := 4 + int(l)
	if need > len(buf) {
		buf = append(buf[:n], make([]byte, need-n)...)
	}
	if n < need {
		m, err := io.ReadAtLeast(r, buf[n:], need-n)
		if err != nil {
			return nil, fmt.Errorf("reading %s of %d bytes: %w", what, l, noEOF(err))
		}
		n += m
	}
	if n > need {
		return nil, fmt.Errorf("reading %s: %d bytes after its %d-byte frame", what, n-need, need)
	}
	return buf[4:need], nil
}

// noEOF turns an end of stream before a whole frame into an unexpected one.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// appendFrame is v's JSON as one frame of at most max bytes.
func appendFrame(v any, max int) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b) > max {
		return nil, fmt.Errorf("frame of %d bytes is over the %d-byte limit", len(b), max)
	}
	return append(binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b))), b...), nil
}

// decode decodes b strictly: unknown fields and trailing data are errors,
// so one message has one meaning; the error quotes b, bounded.
func decode[T any](b []byte, what string) (T, error) {
	var v, zero T
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&v); err != nil {
		return zero, fmt.Errorf("decoding %s %s: %w", what, quote.Value(string(b)), err)
	}
	if len(bytes.TrimSpace(b[d.InputOffset():])) > 0 {
		return zero, fmt.Errorf("decoding %s %s: trailing data after the JSON value", what, quote.Value(string(b)))
	}
	return v, nil
}
