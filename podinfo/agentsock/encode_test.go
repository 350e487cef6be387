package agentsock

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// TestEncodeAnswer: the agent's answer frames are the length and what
// encoding/json writes, invalid UTF-8 included, and decode back.
func TestEncodeAnswer(t *testing.T) {
	as := answers(t)
	as = append(as, Unknown("bad \xff\xfe utf-8 \xe2\x80"), Found("u", &meshpod.Pod{Labels: map[string]string{"\xff": "\xc0\x80", "b": "", "a": ""}}))
	for i, a := range as {
		checkEncoding(t, i, a)
	}
}

func checkEncoding(t *testing.T, i int, a Answer) {
	t.Helper()
	want, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	got, err := appendFrame(a, MaxAnswer)
	if err != nil || binary.BigEndian.Uint32(got) != uint32(len(got)-4) || !bytes.Equal(got[4:], want) {
		t.Fatalf("answer %d: encodeAnswer = %q, %v\nwant %q", i, got, err, want)
	}
	back, err := decode[Answer](got[4:], "answer")
	if wantBack, _ := jsonAnswer(want); err != nil || !reflect.DeepEqual(back, wantBack) {
		t.Fatalf("answer %d: decoding %q: %+v, %v; want %+v", i, got[4:], back, err, wantBack)
	}
}

// FuzzEncodeAnswer: any strings in any field encode as encoding/json
// encodes them, and the plugin decodes them as encoding/json would.
func FuzzEncodeAnswer(f *testing.F) {
	f.Add("found", "0b7c", "shop", "web-1", "sidecar.istio.io/status", `{"a":"<b>&"}`, "ISTIO_META_DNS_CAPTURE", "true", int64(1337), false)
	f.Add("unknown", "", "\u2028", "\xff", "", "\x00\x1f\x7f", "\\\"", "é☃🐧", int64(-1), true)
	f.Fuzz(func(t *testing.T, status, uid, ns, name, key, value, env, arg string, user int64, nils bool) {
		p := &meshpod.Pod{
			Namespace: ns, Name: name,
			Labels: map[string]string{key: value, value: key}, Annotations: map[string]string{key: arg},
			InitContainers: []meshpod.Container{{Name: arg}},
			Containers: []meshpod.Container{{Name: name, Args: []string{arg, value}, Env: []meshpod.EnvVar{{Name: env, Value: value}},
				RunAsUser: &user, RunAsGroup: &user}},
			PodIPs: []string{uid},
		}
		if nils {
			p.Labels, p.InitContainers, p.PodIPs = nil, []meshpod.Container{}, []string{}
			p.Containers[0].Env, p.Containers[0].RunAsGroup = nil, nil
		}
		checkEncoding(t, 0, Answer{V: int(user), Status: status, Reason: key, UID: uid, Pod: p})
	})
}
