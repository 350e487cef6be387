package agentsock

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

func goodRequest() Request {
	return Request{V: Version, Namespace: "shop", Name: "web-1", UID: "0b7c1a2e-5f1d-4a8e-9a55-2c6f5e8d9a01"}
}

func frame(payload string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
	return append(b, payload...)
}

// TestRequestValidate: every bad request is refused with an error naming
// the field and its value, bounded in size.
func TestRequestValidate(t *testing.T) {
	long := strings.Repeat("a", 1<<20)
	for _, tc := range []struct {
		name   string
		mutate func(*Request)
		field  string
	}{
		{"version 0", func(r *Request) { r.V = 0 }, "field v"},
		{"version 2", func(r *Request) { r.V = 2 }, "field v"},
		{"no namespace", func(r *Request) { r.Namespace = "" }, "field namespace"},
		{"no name", func(r *Request) { r.Name = "" }, "field name"},
		{"no uid", func(r *Request) { r.UID = "" }, "field uid"},
		{"long namespace", func(r *Request) { r.Namespace = strings.Repeat("n", 64) }, "field namespace"},
		{"huge name", func(r *Request) { r.Name = long }, "field name"},
		{"long uid", func(r *Request) { r.UID = strings.Repeat("u", 129) }, "field uid"},
		{"slash in name", func(r *Request) { r.Name = "a/b" }, "field name"},
		{"newline in namespace", func(r *Request) { r.Namespace = "a\nb" }, "field namespace"},
		{"NUL in uid", func(r *Request) { r.UID = "a\x00b" }, "field uid"},
		{"invalid UTF-8", func(r *Request) { r.Name = "a\xffb" }, "field name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := goodRequest()
			tc.mutate(&r)
			err := r.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Validate(%+.80v) = %v, want a *FieldError", r, err)
			}
			if !strings.Contains(err.Error(), tc.field) || len(err.Error()) > 512 {
				t.Fatalf("error %.600q does not name %s or is not bounded", err, tc.field)
			}
		})
	}
	if err := goodRequest().Validate(); err != nil {
		t.Fatalf("good request refused: %v", err)
	}
}

// TestCheckAnswer: an answer about anything but the pod asked about, or a
// malformed one, is refused; an "unknown" is accepted as such.
func TestCheckAnswer(t *testing.T) {
	req := goodRequest()
	pod := func() *meshpod.Pod { return &meshpod.Pod{Namespace: req.Namespace, Name: req.Name} }
	for _, tc := range []struct {
		name  string
		a     Answer
		field string // "" means accepted
	}{
		{"found", Found(req.UID, pod()), ""},
		{"unknown", Unknown("not seen"), ""},
		{"other UID (stale cache)", Found("11111111-2222-3333-4444-555555555555", pod()), "field uid"},
		{"empty UID", Found("", pod()), "field uid"},
		{"other namespace", Found(req.UID, &meshpod.Pod{Namespace: "other", Name: req.Name}), "field pod.Namespace"},
		{"other name", Found(req.UID, &meshpod.Pod{Namespace: req.Namespace, Name: "web-2"}), "field pod.Name"},
		{"found without pod", Answer{V: Version, Status: StatusFound, UID: req.UID}, "field pod"},
		{"unknown with pod", Answer{V: Version, Status: StatusUnknown, UID: req.UID, Pod: pod()}, "field status"},
		{"bad status", Answer{V: Version, Status: "maybe"}, "field status"},
		{"huge status", Answer{V: Version, Status: strings.Repeat("x", 1<<20)}, "field status"},
		{"version 0", Answer{Status: StatusUnknown}, "field v"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckAnswer(req, tc.a)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused a good answer: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrWrongAnswer) || !strings.Contains(err.Error(), tc.field) || len(err.Error()) > 1024 {
				t.Fatalf("CheckAnswer = %.1100v, want ErrWrongAnswer naming %s, bounded", err, tc.field)
			}
		})
	}
}

// TestReadFrame: bad frames are errors naming what is wrong, never a
// partial decode; nothing beyond the limit is read.
func TestReadFrame(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "reading request length"},
		{"short header", []byte{0, 0}, "reading request length"},
		{"zero length", frame(""), "field length"},
		{"over the limit", binary.BigEndian.AppendUint32(nil, MaxRequest+1), "field length"},
		{"4 GiB claimed", []byte{0xff, 0xff, 0xff, 0xff}, "field length"},
		{"truncated body", append(binary.BigEndian.AppendUint32(nil, 100), `{"v":1}`...), "reading request of 100 bytes"},
		{"not JSON", frame("hello"), "decoding request"},
		{"unknown field", frame(`{"v":1,"namespace":"a","name":"b","uid":"c","admin":true}`), `unknown field "admin"`},
		{"trailing data", frame(`{"v":1}{"v":2}`), "trailing data"},
		{"two frames", append(frame(`{"v":1}`), frame(`{"v":2}`)...), "11 bytes after its 11-byte frame"},
		{"wrong type", frame(`{"v":"1"}`), "decoding request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readRequest(bytes.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 1024 {
				t.Fatalf("readFrame = %v, want an error containing %q, bounded", err, tc.want)
			}
		})
	}
	var buf bytes.Buffer
	if err := writeFrame(&buf, goodRequest(), MaxRequest); err != nil {
		t.Fatal(err)
	}
	if r, err := readRequest(&buf); err != nil || r != goodRequest() {
		t.Fatalf("round trip: %+v, %v", r, err)
	}
	if _, err := appendFrame(Unknown(strings.Repeat("x", MaxRequest)), MaxRequest); err == nil {
		t.Fatal("encodeAnswer made a frame over its limit")
	}
}

// FuzzRequest: any bytes on the socket give a valid request or an error,
// never a panic; an accepted request survives a round trip unchanged.
func FuzzRequest(f *testing.F) {
	var buf bytes.Buffer
	_ = writeFrame(&buf, goodRequest(), MaxRequest)
	f.Add(buf.Bytes())
	f.Add(frame(`{"v":1,"namespace":"a","name":"b","uid":"c"}`))
	f.Add(frame(`{"v":1,"namespace":"a/b","name":"","uid":"c"}`))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := readRequest(bytes.NewReader(in))
		if err != nil {
			if len(err.Error()) > 2048 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		if err := r.Validate(); err != nil {
			if len(err.Error()) > 1024 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		var out bytes.Buffer
		if err := writeFrame(&out, r, MaxRequest); err != nil {
			t.Fatalf("valid request %+v does not encode: %v", r, err)
		}
		if enc, err := appendFrame(r, MaxRequest); err != nil || string(enc) != out.String() {
			t.Fatalf("the client's request %q is not encoding/json's %q", enc, out.Bytes())
		}
		if back, err := readRequest(&out); err != nil || back != r {
			t.Fatalf("round trip of %+v: %+v, %v", r, back, err)
		}
	})
}

// FuzzAnswer: any answer bytes give a checked answer for the request or an
// error (as the client reads them); an accepted found answer is always
// about the pod asked about.
func FuzzAnswer(f *testing.F) {
	req := goodRequest()
	for _, a := range []Answer{Found(req.UID, &meshpod.Pod{Namespace: req.Namespace, Name: req.Name, Annotations: map[string]string{"a": "b"}}), Unknown("x")} {
		b, _ := json.Marshal(a)
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"status":"found","uid":"x","pod":{"Namespace":"shop","Name":"web-1"}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		a, err := decode[Answer](in, "answer")
		if err != nil {
			return
		}
		if err := CheckAnswer(req, a); err != nil {
			if len(err.Error()) > 2048 {
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
			return
		}
		if a.Status == StatusFound && (a.UID != req.UID || a.Pod == nil || a.Pod.Namespace != req.Namespace || a.Pod.Name != req.Name) {
			t.Fatalf("accepted an answer about another pod: %+v", a)
		}
	})
}

// writeFrame writes v as one frame as encoding/json encodes it: requests
// as the plugins before the hand-written encoding sent them, and answers
// from servers of a test's making.
func writeFrame(w io.Writer, v any, max int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > max {
		return fmt.Errorf("frame of %d bytes is over the %d-byte limit", len(b), max)
	}
	_, err = w.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...))
	return err
}
