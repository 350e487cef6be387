// Package cnisock is the wire format between the nftmesh-cni front process
// and the node agent, which runs the CNI call the front hands it: the
// call's CNI_* variables and its config, with the pod's network namespace
// as a descriptor passed alongside (SCM_RIGHTS); back come the exit status
// and what the plugin wrote on stdout and stderr, or "declined" (run the
// standalone plugin instead).
//
// A frame is a 4-byte magic, a big-endian uint32 length, and that many
// bytes. A request's body: a uint32 count of "NAME=value" strings, each a
// uint32 length and its bytes, then the config, as the runtime wrote it, as
// one such string. A reply's body: a uint32 status, then stdout and stderr
// as such strings.
//
// It also knows the run dir the two share (RunDir) and opens the files
// there (OpenFile) so that a link placed in it is refused.
package cnisock

import (
	"encoding/binary"
	"errors"
	"strconv"
)

// SocketName is the socket's file name in the agent's socket directory
// (agent_run_dir/agent-sock, root only), beside the pod lookup socket.
const SocketName = "cni.sock"

// Path is the socket's path for the agent_run_dir runDir.
func Path(runDir string) string { return runDir + "/agent-sock/" + SocketName }

// Frame limits. A real config with its prevResult is one to a few
// kilobytes, so MaxRequest leaves a margin of tens; a bigger call runs in
// the standalone plugin. A reply (MaxFrame) is what the plugin printed:
// the prevResult again, re-encoded.
const (
	HeaderLen  = 8
	MaxRequest = 64 << 10
	MaxFrame   = 4 << 20
	// MaxEnv bounds the variables of one request (CNI has seven).
	MaxEnv = 32
)

// Frame magics: request and reply, version 1.
var (
	RequestMagic = [4]byte{'N', 'M', 'C', 1}
	ReplyMagic   = [4]byte{'N', 'M', 'R', 1}
)

// Reply statuses.
const (
	StatusOK       uint32 = 0 // the plugin exited 0
	StatusError    uint32 = 1 // the plugin exited 1 (the CNI error is on stdout)
	StatusDeclined uint32 = 2 // the agent did not run the call: nothing written to the namespace
)

// Errors of a malformed frame.
var (
	ErrMagic     = errors.New("not a frame of this protocol (bad magic)")
	ErrTooBig    = errors.New("frame longer than its limit (" + strconv.Itoa(MaxRequest) + " bytes for a request, " + strconv.Itoa(MaxFrame) + " for a reply)")
	ErrTruncated = errors.New("frame body ends early")
	ErrTrailing  = errors.New("bytes after the frame's last field")
	ErrTooMany   = errors.New("more than " + strconv.Itoa(MaxEnv) + " variables")
	ErrStatus    = errors.New("unknown reply status")
)

// Request is one CNI call.
type Request struct {
	// Env holds the call's CNI_* variables as "NAME=value".
	Env []string
	// Stdin is the config the runtime wrote on the plugin's stdin.
	Stdin []byte
}

// Reply is the agent's answer.
type Reply struct {
	Status         uint32
	Stdout, Stderr []byte
}

// AppendRequest appends r's frame to b. A request that does not fit in
// MaxRequest or has too many variables is an error.
func AppendRequest(b []byte, r Request) ([]byte, error) {
	if len(r.Env) > MaxEnv {
		return b, ErrTooMany
	}
	n := 4 + 4 + len(r.Stdin)
	for _, e := range r.Env {
		n += 4 + len(e)
	}
	if n > MaxRequest {
		return b, ErrTooBig
	}
	b = append(b, RequestMagic[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Env)))
	for _, e := range r.Env {
		b = appendString(b, e)
	}
	return appendString(b, string(r.Stdin)), nil
}

// AppendReply appends r's frame to b. Output beyond what fits in MaxFrame
// is cut (stderr first): the plugin's stdout is a result of kilobytes.
func AppendReply(b []byte, r Reply) []byte {
	out, errOut := r.Stdout, r.Stderr
	room := MaxFrame - 12
	if len(out) > room {
		out = out[:room]
	}
	if len(errOut) > room-len(out) {
		errOut = errOut[:room-len(out)]
	}
	b = append(b, ReplyMagic[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(12+len(out)+len(errOut)))
	b = binary.BigEndian.AppendUint32(b, r.Status)
	b = appendString(b, string(out))
	return appendString(b, string(errOut))
}

// BodyLen checks a frame's header against magic and returns its body's
// length, at most MaxRequest for a request and MaxFrame for a reply.
func BodyLen(hdr [HeaderLen]byte, magic [4]byte) (int, error) {
	if [4]byte(hdr[:4]) != magic {
		return 0, ErrMagic
	}
	n, limit := binary.BigEndian.Uint32(hdr[4:]), uint32(MaxFrame)
	if magic == RequestMagic {
		limit = MaxRequest
	}
	if n > limit {
		return 0, ErrTooBig
	}
	return int(n), nil
}

// ParseRequest decodes a request's body. The strings it returns are
// copies; Stdin shares body's memory.
func ParseRequest(body []byte) (Request, error) {
	var r Request
	d := decoder{b: body}
	count := d.u32()
	if d.err == nil && count > MaxEnv {
		return r, ErrTooMany
	}
	for i := uint32(0); i < count && d.err == nil; i++ {
		r.Env = append(r.Env, string(d.bytes()))
	}
	r.Stdin = d.bytes()
	return r, d.end()
}

// ParseReply decodes a reply's body.
func ParseReply(body []byte) (Reply, error) {
	var r Reply
	d := decoder{b: body}
	r.Status = d.u32()
	r.Stdout = d.bytes()
	r.Stderr = d.bytes()
	if err := d.end(); err != nil {
		return Reply{}, err
	}
	if r.Status > StatusDeclined {
		return Reply{}, ErrStatus
	}
	return r, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) u32() uint32 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 4 {
		d.err = ErrTruncated
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.u32()
	if d.err != nil {
		return nil
	}
	if uint64(n) > uint64(len(d.b)) {
		d.err = ErrTruncated
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) end() error {
	if d.err == nil && len(d.b) > 0 {
		d.err = ErrTrailing
	}
	return d.err
}

func appendString(b []byte, s string) []byte {
	return append(binary.BigEndian.AppendUint32(b, uint32(len(s))), s...)
}
