package repair

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// protobufMagic starts every protobuf answer of the API server.
var protobufMagic = []byte("k8s\x00")

// maxPodBytes bounds one encoded pod: etcd refuses requests over 1.5 MiB
// unless raised (--max-request-bytes); this leaves room for that and stops
// a corrupt length from costing more.
const maxPodBytes = 64 << 20

// MaxListPods bounds the pods of one list answer. A byte bound alone does
// not bound the memory a list takes: 64 MiB of near-empty pods is four
// million of them, 12.9 GB in memory (TestAgentClientBoundsHostileAnswers).
// The agent lists one node's pods, 1,000 at most by the scale contract:
// ten times that leaves room for completed pods not yet collected.
const MaxListPods = 10_000

// errTooManyPods ends a list answer over MaxListPods.
var errTooManyPods = fmt.Errorf("over the %d pods one node's list may hold", MaxListPods)

// StreamedPodLister lists pods through rc (a core/v1 REST client), reading
// the answer as it arrives (ReadSlimPodList). The reflector's first list,
// at resourceVersion "0", comes in one piece whatever the limit: on a full
// node megabytes of injected pods, which decoded at once took several
// times their slimmed size.
func StreamedPodLister(rc rest.Interface) func(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
	return func(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
		req := rc.Get().Resource("pods").VersionedParams(&o, scheme.ParameterCodec)
		if o.TimeoutSeconds != nil {
			req = req.Timeout(time.Duration(*o.TimeoutSeconds) * time.Second)
		}
		body, err := req.Stream(ctx)
		if err != nil {
			return nil, err
		}
		defer body.Close()
		return ReadSlimPodList(body)
	}
}

// ReadSlimPodList decodes a pod list answer from r a pod at a time,
// slimming each before it reads the next, so it holds one encoded and one
// decoded pod beyond the slimmed ones. A protobuf answer (runtime.Unknown
// holding a v1 PodList) is streamed; any other is decoded whole as JSON.
func ReadSlimPodList(r io.Reader) (*corev1.PodList, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	if magic, err := br.Peek(len(protobufMagic)); err != nil || !bytes.Equal(magic, protobufMagic) {
		return readJSONPodList(br)
	}
	_, _ = br.Discard(len(protobufMagic))
	p := &pbReader{r: br}
	var (
		out  *corev1.PodList
		tm   runtime.TypeMeta
		buf  bytes.Buffer
		seen bool
	)
	for {
		num, typ, err := p.tag()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, p.fail("reading the answer's next field", err)
		}
		if typ != protowire.BytesType {
			if err := p.skip(typ, -1); err != nil {
				return nil, p.fail(fmt.Sprintf("skipping field %d", num), err)
			}
			continue
		}
		n, err := p.length(-1)
		if err != nil {
			return nil, p.fail(fmt.Sprintf("reading the length of field %d", num), err)
		}
		switch num {
		case 1: // typeMeta
			if err := p.read(n, &buf); err != nil {
				return nil, p.fail("reading the answer's type", err)
			}
			if err := tm.Unmarshal(buf.Bytes()); err != nil {
				return nil, p.fail("decoding the answer's type", err)
			}
			if tm.Kind != "" && tm.Kind != "PodList" {
				return nil, fmt.Errorf("reading the pod list answer: kind %s: not a PodList", quote.Value(tm.Kind))
			}
		case 2: // raw: the PodList
			if seen {
				return nil, p.fail("reading the answer", errors.New("two lists in one answer"))
			}
			seen = true
			if out, err = p.podList(n, &buf); err != nil {
				return nil, err
			}
		case 3: // contentEncoding
			if err := p.read(n, &buf); err != nil {
				return nil, p.fail("reading the answer's content encoding", err)
			}
			if buf.Len() > 0 {
				return nil, fmt.Errorf("reading the pod list answer: content encoding %s: not supported", quote.Value(buf.String()))
			}
		default: // contentType, and fields of later versions
			if err := p.discard(n); err != nil {
				return nil, p.fail(fmt.Sprintf("skipping field %d", num), err)
			}
		}
	}
	if !seen {
		return nil, p.fail("reading the answer", errors.New("no list in it"))
	}
	out.APIVersion, out.Kind = tm.APIVersion, tm.Kind
	return out, nil
}

// podList decodes the PodList of size bytes at p's position.
func (p *pbReader) podList(size int64, buf *bytes.Buffer) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	end := p.off + size
	for p.off < end {
		num, typ, err := p.tag()
		if err != nil {
			return nil, p.fail("reading the list's next field", noEOF(err))
		}
		if typ != protowire.BytesType {
			if err := p.skip(typ, end-p.off); err != nil {
				return nil, p.fail(fmt.Sprintf("skipping list field %d", num), err)
			}
			continue
		}
		n, err := p.length(end - p.off)
		if err != nil {
			return nil, p.fail(fmt.Sprintf("reading the length of list field %d", num), err)
		}
		switch num {
		case 1: // metadata
			if err := p.read(n, buf); err != nil {
				return nil, p.fail("reading the list's metadata", err)
			}
			if err := out.ListMeta.Unmarshal(buf.Bytes()); err != nil {
				return nil, p.fail("decoding the list's metadata", err)
			}
		case 2: // items
			if len(out.Items) >= MaxListPods {
				return nil, p.fail(fmt.Sprintf("reading pod %d", len(out.Items)+1), errTooManyPods)
			}
			if n > maxPodBytes {
				return nil, p.fail(fmt.Sprintf("reading pod %d", len(out.Items)+1), fmt.Errorf("%d bytes: over the %d bytes one pod may take", n, maxPodBytes))
			}
			if err := p.read(n, buf); err != nil {
				return nil, p.fail(fmt.Sprintf("reading pod %d", len(out.Items)+1), err)
			}
			var pod corev1.Pod
			if err := pod.Unmarshal(buf.Bytes()); err != nil {
				return nil, p.fail(fmt.Sprintf("decoding pod %d", len(out.Items)+1), err)
			}
			slim, _ := SlimPod(&pod)
			out.Items = append(out.Items, *slim.(*corev1.Pod))
		default:
			if err := p.discard(n); err != nil {
				return nil, p.fail(fmt.Sprintf("skipping list field %d", num), err)
			}
		}
	}
	if p.off != end {
		return nil, p.fail("reading the list", fmt.Errorf("its last field ends %d bytes past its end", p.off-end))
	}
	return out, nil
}

// readJSONPodList decodes a JSON answer whole, then slims its pods.
func readJSONPodList(r io.Reader) (*corev1.PodList, error) {
	var raw struct {
		metav1.TypeMeta `json:",inline"`
		metav1.ListMeta `json:"metadata,omitempty"`
		Items           slimPods `json:"items"`
	}
	if err := json.NewDecoder(r).Decode(&raw); err != nil {
		return nil, fmt.Errorf("reading the pod list answer as JSON: %w", err)
	}
	return &corev1.PodList{TypeMeta: raw.TypeMeta, ListMeta: raw.ListMeta, Items: raw.Items}, nil
}

// slimPods is a list's items, decoded a pod at a time, each slimmed before
// the next and counted: decoded at once, a long list of small pods took
// gigabytes.
type slimPods []corev1.Pod

func (s *slimPods) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*s = nil
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if t, err := d.Token(); err != nil || t != json.Delim('[') {
		return fmt.Errorf("items: not an array (%v)", err)
	}
	out := slimPods{}
	for d.More() {
		if len(out) >= MaxListPods {
			return fmt.Errorf("items: %w", errTooManyPods)
		}
		var pod corev1.Pod
		if err := d.Decode(&pod); err != nil {
			return fmt.Errorf("decoding pod %d: %w", len(out)+1, err)
		}
		slim, _ := SlimPod(&pod)
		out = append(out, *slim.(*corev1.Pod))
	}
	*s = out
	return nil
}

// pbReader reads protobuf fields from a stream, counting what it consumed.
type pbReader struct {
	r   *bufio.Reader
	off int64
}

func (p *pbReader) ReadByte() (byte, error) {
	b, err := p.r.ReadByte()
	if err == nil {
		p.off++
	}
	return b, err
}

// fail names the offset of the answer where reading stopped.
func (p *pbReader) fail(what string, err error) error {
	return fmt.Errorf("reading the pod list answer: %s at byte %d: %w", what, p.off+int64(len(protobufMagic)), err)
}

// tag reads a field's tag; io.EOF only when the stream ends before it.
func (p *pbReader) tag() (protowire.Number, protowire.Type, error) {
	start := p.off
	v, err := binary.ReadUvarint(p)
	if err != nil {
		if errors.Is(err, io.EOF) && p.off > start {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, err
	}
	num, typ := protowire.DecodeTag(v)
	if num < protowire.MinValidNumber || num > protowire.MaxValidNumber {
		return 0, 0, fmt.Errorf("field number %d out of range", num)
	}
	return num, typ, nil
}

// length reads a length prefix, at most max when max >= 0.
func (p *pbReader) length(max int64) (int64, error) {
	v, err := binary.ReadUvarint(p)
	if err != nil {
		return 0, noEOF(err)
	}
	if v > 1<<62 || max >= 0 && int64(v) > max {
		return 0, fmt.Errorf("length %d past the end of its list", v)
	}
	return int64(v), nil
}

// read reads n bytes into buf (replacing its content), growing it only as
// the bytes arrive.
func (p *pbReader) read(n int64, buf *bytes.Buffer) error {
	buf.Reset()
	got, err := io.CopyN(buf, p.r, n)
	p.off += got
	return noEOF(err)
}

func (p *pbReader) discard(n int64) error {
	got, err := io.CopyN(io.Discard, p.r, n)
	p.off += got
	return noEOF(err)
}

// skip skips a value of a wire type other than bytes, within max bytes
// when max >= 0.
func (p *pbReader) skip(typ protowire.Type, max int64) error {
	switch typ {
	case protowire.VarintType:
		_, err := binary.ReadUvarint(p)
		return noEOF(err)
	case protowire.Fixed32Type, protowire.Fixed64Type:
		n := int64(4)
		if typ == protowire.Fixed64Type {
			n = 8
		}
		if max >= 0 && n > max {
			return fmt.Errorf("a %d-byte value past the end of its list", n)
		}
		return p.discard(n)
	}
	return fmt.Errorf("wire type %d not supported", typ)
}

// noEOF turns an end of stream inside a field into an unexpected one.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
