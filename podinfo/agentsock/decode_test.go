package agentsock

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/podinfo"
	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/testkit/kubetest"
)

func int64p(v int64) *int64 { return &v }

// answers are answers as the agent writes them, with every field and the
// strings JSON escapes.
func answers(tb testing.TB) []Answer {
	pod, err := kubetest.ReadPodFile(filepath.Join("..", "..", "testdata", "pods", "injected.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	odd := "quote\" backslash\\ slash/ tab\t nl\n cr\r ctl\x01\x1f del\x7f <html>&amp; é ☃ 🐧 \u2028\u2029 \ufffd"
	return []Answer{
		Found("0b7c1a2e-5f1d-4a8e-9a55-2c6f5e8d9a01", podinfo.Mesh(pod)),
		Unknown("not in the pod cache"),
		Unknown(odd),
		Found("u", &meshpod.Pod{}),
		Found("u", &meshpod.Pod{
			Namespace: odd, Name: "n",
			Labels: map[string]string{}, Annotations: map[string]string{odd: odd, "": ""},
			InitContainers: []meshpod.Container{}, PodIPs: []string{},
			Containers: []meshpod.Container{
				{},
				{Name: odd, Args: []string{odd, ""}, Env: []meshpod.EnvVar{{}, {Name: odd, Value: odd}},
					RunAsUser: int64p(-9223372036854775808), RunAsGroup: int64p(9223372036854775807)},
				{Args: []string{}, Env: []meshpod.EnvVar{}, RunAsUser: int64p(0)},
			},
		}),
		{V: -3, Status: odd, Reason: odd, UID: odd},
	}
}

// jsonAnswer is encoding/json's own reading of b, without decode's
// strictness (unknown fields, trailing data): the reference decode agrees
// with on everything it accepts.
func jsonAnswer(b []byte) (Answer, error) {
	var a Answer
	err := json.Unmarshal(b, &a)
	return a, err
}

// TestDecodeAnswer: what the agent writes decodes as encoding/json
// decodes it, indented or not.
func TestDecodeAnswer(t *testing.T) {
	for i, a := range answers(t) {
		for _, indent := range []bool{false, true} {
			b, err := json.Marshal(a)
			if indent {
				b, err = json.MarshalIndent(a, " \r\n", "\t")
			}
			if err != nil {
				t.Fatal(err)
			}
			want, err := jsonAnswer(b)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decode[Answer](b, "answer")
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("answer %d (indented %v) %s:\ngot  %+v, %v\nwant %+v", i, indent, b, got, err, want)
			}
		}
	}
}

// TestDecodeAnswerBad: malformed answers, and the ones encoding/json
// would take but the agent never writes, are errors naming the place.
func TestDecodeAnswerBad(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	for _, tc := range []struct{ in, want string }{
		{``, "at byte 0: unexpected end"},
		{`   `, "at byte 3: unexpected end"},
		{`[]`, `found '[' where '{' belongs`},
		{`{"v":1`, "at byte 6: unexpected end"},
		{`{"v":1,}`, `at byte 7: found '}' where '"' belongs`},
		{`{"v":1}}`, "at byte 7: trailing data"},
		{`{"v":1} {}`, "trailing data"},
		{`{"v":1 "status":"found"}`, `found '"' where '}' belongs`},
		{`{"v" 1}`, `found '1' where ':' belongs`},
		{`{"admin":true}`, `at byte 1: unknown field "admin"`},
		{`{"v":"1"}`, `found '"' where an integer belongs`},
		{`{"v":1.0}`, "not an integer"},
		{`{"v":1e3}`, "not an integer"},
		{`{"v":01}`, "leading zero"},
		{`{"v":-}`, "where an integer belongs"},
		{`{"v":99999999999999999999}`, "out of range"},
		{`{"pod":{"Containers":[{"RunAsUser":1.5}]}}`, "not an integer"},
		{`{"pod":{"Containers":[{"Env":[{"Name":"a","Other":"b"}]}]}}`, `unknown field "Other"`},
		{`{"pod":{"PodIPs":["a",]}}`, `found ']' where '"' belongs`},
		{`{"pod":{"PodIPs":["a" "b"]}}`, `found '"' where ']' belongs`},
		{`{"pod":{"Labels":{"a":1}}}`, `found '1' where '"' belongs`},
		{`{"status":"a` + "\x00" + `"}`, "control character"},
		{`{"status":"\x"}`, `invalid escape "\\x"`},
		{`{"status":"\u12g4"}`, `invalid \u escape`},
		{`{"status":"\u12`, "unexpected end"},
		{`{"status":"abc`, "unexpected end"},
		{`{"reason":"` + long, "unexpected end"},
	} {
		// tc.want: what is wrong (encoding/json's messages say it their
		// own way).
		_, err := decode[Answer]([]byte(tc.in), "answer")
		if err == nil || len(err.Error()) > 2048 {
			t.Errorf("decode(%.40q) = %v, want an error (%s), bounded", tc.in, err, tc.want)
		}
	}
}

// FuzzDecodeAnswer: the answer decoder never panics, accepts nothing a
// strict encoding/json decode refuses, bounds its errors, and whatever it
// accepts, re-encoded as the agent writes it, decodes to the same answer.
func FuzzDecodeAnswer(f *testing.F) {
	for _, a := range answers(f) {
		b, _ := json.Marshal(a)
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"status":"found","uid":"u","pod":{"Namespace":"a","Name":"b","Labels":null}}`))
	f.Add([]byte(`{"status":"\ud83d\udc27 \u00e9","pod":null}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := decode[Answer](in, "answer")
		want, jerr := jsonAnswer(in)
		if err == nil {
			if jerr != nil {
				t.Fatalf("accepted %q, which encoding/json refuses: %v", in, jerr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%q:\ngot  %+v\nwant %+v", in, got, want)
			}
		} else if len(err.Error()) > 2048 {
			t.Fatalf("error of %d bytes", len(err.Error()))
		}
		if jerr != nil {
			return
		}
		canon, merr := json.Marshal(want)
		if merr != nil {
			t.Fatal(merr)
		}
		want, _ = jsonAnswer(canon)
		if got, err := decode[Answer](canon, "answer"); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q as the agent writes it, %s:\ngot  %+v, %v\nwant %+v", in, canon, got, err, want)
		}
	})
}
