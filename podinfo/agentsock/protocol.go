// Package agentsock is the node-local question the CNI plugin asks the
// node agent before it asks the API server: "what do you know of pod
// namespace/name with this UID?". The agent answers from the pod informer
// it keeps for its node, so a pod start costs the control plane nothing.
//
// It owns the wire format (one length-prefixed JSON request and one answer
// per connection, both bounded, encoding/json over a net.UnixConn), the
// client the plugin uses, and the server the agent runs, with the socket's
// place and permissions and the peer check (root only, by SO_PEERCRED). It imports nothing from
// Kubernetes, so the plugin that links it pays no client-go start-up: the
// agent side supplies answers through the Resolver interface (see
// installer/podcache).
//
// An answer is either the fields of the pod the in-mesh decision reads
// (podinfo/meshpod.Pod) for exactly the UID asked about, or "unknown".
// "unknown" and every failure (no socket, no answer in time, a malformed
// or mismatched answer) send the plugin to its own API lookup, which fails
// closed: the socket can make an ADD faster, never let a pod through
// without the decision the API would give.
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

// Bounds on what either side reads. A request is three short names. An
// answer carries a pod's labels, annotations and containers' args and env:
// the API server caps a whole object at about 1.5 MiB, so 2 MiB holds any
// real pod's decision fields.
const (
	MaxRequest = 4 << 10
	MaxAnswer  = 2 << 20
	// Kubernetes bounds: a namespace is a DNS label, a pod name a DNS
	// subdomain; UIDs are UUIDs (36 bytes), bounded loosely.
	maxNamespace = 63
	maxName      = 253
	maxUID       = 128
)

// Answer statuses.
const (
	// StatusFound: Pod holds the decision fields of the pod with UID.
	StatusFound = "found"
	// StatusUnknown: the agent cannot answer for that UID (not seen
	// within its wait, deleted, a different UID, API unreachable); Reason
	// says why. The plugin asks the API server itself.
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
	V      int    `json:"v"`
	Status string `json:"status"`
	// Reason is why the answer is unknown (for the plugin's log).
	Reason string `json:"reason,omitempty"`
	// UID is the UID of the pod in Pod; it equals the request's.
	UID string       `json:"uid,omitempty"`
	Pod *meshpod.Pod `json:"pod,omitempty"`
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

// Validate checks a request: the protocol version, and names a kubelet
// could have passed (non-empty, within Kubernetes' lengths, printable).
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

// ErrWrongAnswer is wrapped by CheckAnswer's errors: the answer is not a
// usable answer to the request (the plugin then asks the API server).
var ErrWrongAnswer = errors.New("not an answer to the request")

// CheckAnswer checks that a is a well-formed answer to req: the protocol
// version, a known status, and for a found pod the very namespace, name
// and UID asked about. An answer about another pod, however it came about
// (a stale cache, a bug, a forged reply), is never used.
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

// readRequest reads the one request of a connection, strictly: unknown
// fields and trailing data are errors, so one message has one meaning.
func readRequest(r io.Reader) (Request, error) {
	b, err := readPayload(r, MaxRequest, "request")
	if err != nil {
		return Request{}, err
	}
	return decodeRequest(b)
}

// readPayload reads one frame of at most max bytes and returns its
// payload. It reads as much as the frame may hold at once, so a frame
// already waiting takes one read; bytes after the frame (one frame per
// connection) are an error.
func readPayload(r io.Reader, max int, what string) ([]byte, error) {
	buf := make([]byte, 0, 4+min(max, firstRead))
	need := 4 // the header; then the whole frame
	for len(buf) < need {
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		var ferr error
		if buf, need, ferr = frameLength(buf, need, max, what); ferr != nil {
			return nil, ferr
		}
		if len(buf) >= need {
			break
		}
		if err == nil && n == 0 {
			err = io.ErrNoProgress
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, readErr(need, what, err)
		}
	}
	return framePayload(buf, need, what)
}

// frameLength reads the frame's length once its 4-byte header is in buf
// (while need is still 4): need becomes the whole frame's size, buf grows
// to hold it. A length of 0 or over max is an error.
func frameLength(buf []byte, need, max int, what string) ([]byte, int, error) {
	if need != 4 || len(buf) < 4 {
		return buf, need, nil
	}
	l := binary.BigEndian.Uint32(buf)
	if l == 0 || l > uint32(max) {
		return nil, 0, &FieldError{what, "length", fmt.Sprint(l), fmt.Sprintf("is not within 1..%d bytes", max)}
	}
	need = 4 + int(l)
	if need > cap(buf) {
		buf = append(make([]byte, 0, need), buf...)
	}
	return buf, need, nil
}

// framePayload is a whole frame's payload; bytes after the frame are an
// error (one frame per connection: more is a sender to distrust).
func framePayload(buf []byte, need int, what string) ([]byte, error) {
	if len(buf) > need {
		return nil, fmt.Errorf("reading %s: %d bytes after its %d-byte frame", what, len(buf)-need, need)
	}
	return buf[4:], nil
}

// readErr names what a failed read was reading: the length, or the frame.
func readErr(need int, what string, err error) error {
	if need == 4 {
		return fmt.Errorf("reading %s length: %w", what, err)
	}
	return fmt.Errorf("reading %s of %d bytes: %w", what, need-4, err)
}

// firstRead is the buffer of a frame's first read, which holds a usual
// answer whole.
const firstRead = 16 << 10

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

// encodeAnswer is a as one frame of at most max bytes.
func encodeAnswer(a Answer, max int) ([]byte, error) { return appendFrame(a, max) }

// encodeRequest is req as one frame (a valid request is far below
// MaxRequest).
func encodeRequest(req Request) ([]byte, error) { return appendFrame(req, MaxRequest) }

// decodeStrict decodes b into v: unknown fields and trailing data are
// errors, so one message has one meaning; the error quotes b, bounded.
func decodeStrict(b []byte, v any, what string) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("decoding %s %s: %w", what, quote.Value(string(b)), err)
	}
	if len(bytes.TrimSpace(b[d.InputOffset():])) > 0 {
		return fmt.Errorf("decoding %s %s: trailing data after the JSON value", what, quote.Value(string(b)))
	}
	return nil
}

// decodeAnswer decodes an answer's JSON.
func decodeAnswer(b []byte) (Answer, error) {
	var a Answer
	if err := decodeStrict(b, &a, "answer"); err != nil {
		return Answer{}, err
	}
	return a, nil
}

// decodeRequest decodes a request's JSON.
func decodeRequest(b []byte) (Request, error) {
	var r Request
	if err := decodeStrict(b, &r, "request"); err != nil {
		return Request{}, err
	}
	return r, nil
}
