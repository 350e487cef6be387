package agentsock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// InspectSocketName is the agent's socket on which `redirect inspect
// NAMESPACE/NAME` asks for a pod of the agent's node: the agent answers
// with the pod's decision fields from its pod watch and hands over the
// pod's network namespace, found by the pod's cgroup as repair in place
// finds it (so it works in every repair mode, on the node or through
// `kubectl exec` into the agent).
const InspectSocketName = "inspect.sock"

// Bounds on a request (a name) and an answer (as the pod socket's).
const (
	maxInspectRequest = 4 << 10
	maxInspectAnswer  = 2 << 20
)

// InspectRequest names the pod.
type InspectRequest struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// InspectAnswer is the pod and where its namespace was found; Error says
// why there is none. The namespace itself travels beside the answer as a
// descriptor (SCM_RIGHTS).
type InspectAnswer struct {
	Error string       `json:"error,omitempty"`
	UID   string       `json:"uid,omitempty"`
	Pod   *meshpod.Pod `json:"pod,omitempty"`
	Netns string       `json:"netns,omitempty"` // <proc>/<pid>/ns/net in the agent's view
	Match string       `json:"match,omitempty"` // how it was recognised: cgroup or address
}

// InspectFunc answers one request: the answer and, with no error, the open
// namespace descriptor to hand over (the server closes it once sent).
type InspectFunc func(ctx context.Context, req InspectRequest) (InspectAnswer, int)

// ServeInspect answers requests on l with find until ctx ends; a peer that
// allow refuses gets an error and nothing else.
func ServeInspect(ctx context.Context, l *Listener, allow func(*net.UnixConn) error, find InspectFunc) error {
	return l.ServeConns(ctx, Handlers{Serve: func(c *net.UnixConn) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if err := allow(c); err != nil {
			_ = writeInspect(c, InspectAnswer{Error: "refused: " + err.Error()}, -1)
			return
		}
		var req InspectRequest
		dec := json.NewDecoder(io.LimitReader(c, maxInspectRequest))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			_ = writeInspect(c, InspectAnswer{Error: "bad request: " + quote.Text(err.Error())}, -1)
			return
		}
		if req.Namespace == "" || req.Name == "" || len(req.Namespace) > maxNamespace || len(req.Name) > maxName {
			_ = writeInspect(c, InspectAnswer{Error: fmt.Sprintf("bad request: pod %s/%s", quote.Value(req.Namespace), quote.Value(req.Name))}, -1)
			return
		}
		a, fd := find(ctx, req)
		if fd >= 0 {
			defer unix.Close(fd)
		}
		_ = writeInspect(c, a, fd)
	}})
}

func writeInspect(c *net.UnixConn, a InspectAnswer, fd int) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	var oob []byte
	if fd >= 0 && a.Error == "" {
		oob = unix.UnixRights(fd)
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

// AskInspect asks the agent whose run dir is runDir for pod ns/name and
// returns its answer and the namespace as an open descriptor (the caller
// closes it).
func AskInspect(ctx context.Context, runDir string, req InspectRequest) (InspectAnswer, *os.File, error) {
	path := filepath.Join(runDir, DirName, InspectSocketName)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return InspectAnswer{}, nil, fmt.Errorf("asking the nftmesh agent (%s; run this on the pod's node as root, or in the agent's container with kubectl exec): %w", path, err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	uid, err := PeerUIDOf(c)
	if err != nil {
		return InspectAnswer{}, nil, err
	}
	if uid != PeerUID {
		return InspectAnswer{}, nil, fmt.Errorf("%s is served by uid %d, not root: not the nftmesh agent", path, uid)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return InspectAnswer{}, nil, err
	}
	if _, err := c.Write(b); err != nil {
		return InspectAnswer{}, nil, fmt.Errorf("asking the nftmesh agent: %w", err)
	}
	_ = c.CloseWrite()
	buf := make([]byte, maxInspectAnswer)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return InspectAnswer{}, nil, fmt.Errorf("reading the nftmesh agent's answer: %w", err)
	}
	var file *os.File
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err == nil && len(msgs) == 1 {
			if fds, err := unix.ParseUnixRights(&msgs[0]); err == nil && len(fds) == 1 {
				file = os.NewFile(uintptr(fds[0]), "netns")
			}
		}
	}
	var a InspectAnswer
	err = json.Unmarshal(buf[:n], &a)
	switch {
	case err != nil:
		a, err = InspectAnswer{}, fmt.Errorf("reading the nftmesh agent's answer: %w", err)
	case a.Error != "":
		err = fmt.Errorf("the nftmesh agent: %s", a.Error)
	case file == nil || a.Pod == nil:
		err = errors.New("the nftmesh agent answered without the pod or its namespace")
	case a.Pod.Namespace != req.Namespace || a.Pod.Name != req.Name:
		err = fmt.Errorf("the nftmesh agent answered about pod %s/%s, not the one asked about", quote.Value(a.Pod.Namespace), quote.Value(a.Pod.Name))
	}
	if err != nil {
		if file != nil {
			file.Close()
		}
		return a, nil, err
	}
	return a, file, nil
}
