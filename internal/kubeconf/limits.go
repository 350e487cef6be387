package kubeconf

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// Limits bounds the 2xx answers Guard passes on, by kind; zero is no
// bound. A request's kind is read from its URL, as the API server's own
// request info reads it.
type Limits struct {
	// Object bounds an answer about one object: a GET of it, what a write
	// returns; and a list in any encoding but protobuf.
	Object int64
	// List bounds a GET of a collection, which holds many objects, in
	// protobuf: the encoding a reader can walk an object at a time
	// (repair.ReadSlimPodList). A JSON list is read whole before it is
	// decoded (encoding/json), its buffer doubling as it grows; an API
	// server answers protobuf when asked, so only another server would
	// send one, and it gets the Object bound.
	List int64
	// Event bounds each event of a watch (a stream that lasts as long as
	// the watch, so never bounded whole) whose framing apimachinery does
	// not bound: JSON, one event a line. A protobuf watch's events are
	// bounded by apimachinery's streaming decoder (16 MiB each: an event
	// over it ends the watch with ErrObjectTooLarge, and the informer
	// watches again).
	Event int64
}

// bound wraps the body of resp, a 2xx answer to req, in its bound.
func (l Limits) bound(req *http.Request, resp *http.Response) io.ReadCloser {
	switch {
	case isWatch(req):
		if l.Event <= 0 || isProtobuf(resp.Header.Get("Content-Type")) {
			return resp.Body
		}
		return &eventCapped{r: resp.Body, max: l.Event}
	case req.Method == http.MethodGet && isCollection(req.URL.Path) && isProtobuf(resp.Header.Get("Content-Type")):
		return capBody(resp.Body, l.List)
	}
	return capBody(resp.Body, l.Object)
}

func capBody(body io.ReadCloser, max int64) io.ReadCloser {
	if max <= 0 {
		return body
	}
	return &capped{r: body, left: max, max: max}
}

// isWatch: client-go asks for a watch with ?watch=true (a streaming list
// too); /watch/ paths are the older form.
func isWatch(req *http.Request) bool {
	if w, err := strconv.ParseBool(req.URL.Query().Get("watch")); err == nil && w {
		return true
	}
	_, rest, ok := apiPath(req.URL.Path)
	return ok && len(rest) > 0 && rest[0] == "watch"
}

func isProtobuf(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/vnd.kubernetes.protobuf"
}

// isCollection reports whether path names a collection (pods, a
// namespace's pods) rather than one object (a pod, its status) or
// something else, as the API server parses it: after /api/VERSION or
// /apis/GROUP/VERSION, "namespaces/NS/" when more follows, then RESOURCE
// alone is a collection, RESOURCE/NAME[/SUBRESOURCE] an object.
func isCollection(path string) bool {
	_, rest, ok := apiPath(path)
	if !ok {
		return false
	}
	if len(rest) >= 3 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	return len(rest) == 1 && rest[0] != ""
}

// apiPath finds the API part of path (after any prefix a proxy adds):
// /api/VERSION or /apis/GROUP/VERSION, and the segments after it.
func apiPath(path string) (prefix, rest []string, ok bool) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for i := range segs {
		switch {
		case segs[i] == "api" && i+1 < len(segs) && isVersion(segs[i+1]):
			return segs[:i+2], segs[i+2:], true
		case segs[i] == "apis" && i+2 < len(segs) && isVersion(segs[i+2]):
			return segs[:i+3], segs[i+3:], true
		}
	}
	return nil, nil, false
}

// isVersion: v1, v1beta2, v2alpha1 ... (Kubernetes' API versions).
func isVersion(s string) bool {
	num := func(s string) (rest string, ok bool) {
		t := strings.TrimLeft(s, "0123456789")
		return t, len(t) < len(s) && s[0] != '0'
	}
	rest, ok := strings.CutPrefix(s, "v")
	if !ok {
		return false
	}
	if rest, ok = num(rest); !ok || rest == "" {
		return ok
	}
	for _, level := range []string{"alpha", "beta"} {
		if r, cut := strings.CutPrefix(rest, level); cut {
			r, ok = num(r)
			return ok && r == ""
		}
	}
	return false
}

// eventCapped fails a watch stream once one of its lines (a JSON watch
// event; the API server ends each with a newline) runs over max bytes.
type eventCapped struct {
	r   io.ReadCloser
	max int64
	run int64 // bytes since the last newline
}

func (c *eventCapped) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	for rest := p[:n]; ; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			c.run += int64(len(rest))
			break
		}
		if c.run += int64(i); c.run > c.max {
			break
		}
		c.run, rest = 0, rest[i+1:]
	}
	if c.run > c.max {
		return 0, fmt.Errorf("%w: a watch event over %d bytes", ErrAnswerTooLarge, c.max)
	}
	return n, err
}

func (c *eventCapped) Close() error { return c.r.Close() }
