package cnisock

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/podinfo/cniconf"
)

func TestDefaultRunDirIsThePluginsDefault(t *testing.T) {
	if DefaultRunDir != cniconf.DefaultAgentRunDir {
		t.Fatalf("DefaultRunDir %q, the plugin config's default is %q", DefaultRunDir, cniconf.DefaultAgentRunDir)
	}
}

func TestRunDir(t *testing.T) {
	for _, tt := range []struct {
		name, config string
		want         string
		ok           bool
	}{
		{"absent", `{"cniVersion":"1.0.0","name":"k8s","type":"nftmesh-cni"}`, DefaultRunDir, true},
		{"ours", `{"name":"k8s","agent_run_dir":"/run/x"}`, "/run/x", true},
		{"cleaned", `{"agent_run_dir":"/run//x/../y/"}`, "/run/y", true},
		{"istio alias", `{"cni_agent_run_dir":"/var/run/istio-cni"}`, "/var/run/istio-cni", true},
		{"ours wins over the alias", `{"cni_agent_run_dir":"/a","agent_run_dir":"/b"}`, "/b", true},
		{"empty ours is the default, alias or not", `{"cni_agent_run_dir":"/a","agent_run_dir":""}`, DefaultRunDir, true},
		{"nested keys are not the config's", `{"prevResult":{"agent_run_dir":"/evil"},"x":[{"agent_run_dir":"/evil"}]}`, DefaultRunDir, true},
		{"escaped quote hides no key", `{"a":"x\",\"agent_run_dir\":\"/evil","b":1}`, DefaultRunDir, true},
		{"simple escapes", `{"agent_run_dir":"/run/a\/b\tc"}`, "/run/a/b\tc", true},
		{"\\u escape", `{"agent_run_dir":"/run/\u0078"}`, `/run/x`, true},
		{"\\u-escaped key is the key, as the plugin reads it", `{"agent\u005frun_dir":"/r"}`, "/r", true},
		{"keys match in any case, as the plugin reads them", `{"AGENT_RUN_DIR":"/r"}`, "/r", true},
		{"twice: the last, as the plugin reads it", `{"agent_run_dir":"/a","agent_run_dir":"/b"}`, "/b", true},
		{"whitespace everywhere", " \n{ \"agent_run_dir\" :\t\"/r\" , \"n\" : [ 1 , -2.5e+3 , true , false , null , { } , [ ] ] } \r\n", "/r", true},
		{"numbers", `{"a":0,"b":-0.5,"c":1E9,"d":12e-3}`, DefaultRunDir, true},
		{"empty object", `{}`, DefaultRunDir, true},
		// Refused: the plugin reports these itself.
		{"empty", ``, "", false},
		{"not an object", `["agent_run_dir"]`, "", false},
		{"relative", `{"agent_run_dir":"run/x"}`, "", false},
		{"not a string", `{"agent_run_dir":5}`, "", false},
		{"trailing comma", `{"a":1,}`, "", false},
		{"trailing data", `{"a":1} x`, "", false},
		{"two objects", `{}{}`, "", false},
		{"unterminated", `{"a":"b`, "", false},
		{"unclosed nest", `{"a":[{"b":1}`, "", false},
		{"mismatched", `{"a":[1}}`, "", false},
		{"bad literal", `{"a":tru}`, "", false},
		{"bad number", `{"a":01}`, "", false},
		{"bare minus", `{"a":-}`, "", false},
		{"dot without digits", `{"a":1.}`, "", false},
		{"control character", "{\"a\":\"x\ny\"}", "", false},
		{"bad escape", `{"a":"\x"}`, "", false},
		{"short \\u", `{"a":"\u12"}`, "", false},
		{"missing colon", `{"a" 1}`, "", false},
		{"key not a string", `{a:1}`, "", false},
		{"deep", `{"a":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := RunDir([]byte(tt.config))
			if got != tt.want || ok != tt.ok {
				t.Fatalf("RunDir(%q) = %q, %v; want %q, %v", tt.config, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// FuzzRunDir: RunDir never panics, takes only valid JSON objects, and
// wherever the plugin takes the config it reads the same run dir.
func FuzzRunDir(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"k8s","type":"nftmesh-cni","agent_run_dir":"/run/x"}`,
		`{"cni_agent_run_dir":"/a","agent_run_dir":""}`,
		`{"a":[{"b":"\"agent_run_dir\""}],"agent_run_dir":"/x/../y"}`,
		`{"AGENT_RUN_DIR":"/z"}`,
		`{"agent\u005frun_dir":"/z"}`,
		"{\"agent_run_dir\":\"/\x9e\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, config []byte) {
		got, ok := RunDir(config)
		if !ok {
			return
		}
		if !json.Valid(config) {
			t.Fatalf("RunDir took invalid JSON %q (gave %q)", config, got)
		}
		if c, err := cniconf.ParseConfig(config); err == nil && c.AgentRunDir != got {
			t.Fatalf("RunDir(%q) = %q, the plugin reads %q", config, got, c.AgentRunDir)
		}
	})
}

func TestRequestRoundTrip(t *testing.T) {
	r := Request{Env: []string{"CNI_COMMAND=ADD", "CNI_NETNS=/run/netns/x", "CNI_ARGS="}, Stdin: []byte(`{"name":"k8s"}`)}
	b, err := AppendRequest([]byte("prefix"), r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("prefix")) {
		t.Fatal("AppendRequest did not append")
	}
	b = b[len("prefix"):]
	n, err := BodyLen([HeaderLen]byte(b), RequestMagic)
	if err != nil || n != len(b)-HeaderLen {
		t.Fatalf("BodyLen = %d, %v; frame body is %d", n, err, len(b)-HeaderLen)
	}
	got, err := ParseRequest(b[HeaderLen:])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got.Env, "\n") != strings.Join(r.Env, "\n") || string(got.Stdin) != string(r.Stdin) {
		t.Fatalf("round trip: %+v, want %+v", got, r)
	}
}

func TestReplyRoundTrip(t *testing.T) {
	for _, r := range []Reply{
		{Status: StatusOK, Stdout: []byte(`{"cniVersion":"1.0.0"}`), Stderr: []byte("log\n")},
		{Status: StatusError, Stdout: []byte(`{"code":100}`)},
		{Status: StatusDeclined},
	} {
		b := AppendReply(nil, r)
		n, err := BodyLen([HeaderLen]byte(b), ReplyMagic)
		if err != nil || n != len(b)-HeaderLen {
			t.Fatalf("BodyLen = %d, %v", n, err)
		}
		got, err := ParseReply(b[HeaderLen:])
		if err != nil || got.Status != r.Status || string(got.Stdout) != string(r.Stdout) || string(got.Stderr) != string(r.Stderr) {
			t.Fatalf("round trip of %+v: %+v, %v", r, got, err)
		}
	}
}

func TestReplyCutToFit(t *testing.T) {
	big := bytes.Repeat([]byte("x"), MaxFrame)
	b := AppendReply(nil, Reply{Status: StatusOK, Stdout: []byte("{}"), Stderr: big})
	if len(b)-HeaderLen > MaxFrame {
		t.Fatalf("reply frame body %d > %d", len(b)-HeaderLen, MaxFrame)
	}
	got, err := ParseReply(b[HeaderLen:])
	if err != nil || string(got.Stdout) != "{}" {
		t.Fatalf("cut reply: stdout %q, %v (stdout must survive, stderr is cut first)", got.Stdout, err)
	}
}

func TestBadFrames(t *testing.T) {
	hdr := func(magic [4]byte, n uint32) [HeaderLen]byte {
		var h [HeaderLen]byte
		copy(h[:], magic[:])
		h[4], h[5], h[6], h[7] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
		return h
	}
	if _, err := BodyLen(hdr(ReplyMagic, 1), RequestMagic); !errors.Is(err, ErrMagic) {
		t.Errorf("reply magic as a request: %v", err)
	}
	if _, err := BodyLen(hdr(RequestMagic, MaxRequest+1), RequestMagic); !errors.Is(err, ErrTooBig) {
		t.Errorf("oversized frame: %v", err)
	}
	if _, err := AppendRequest(nil, Request{Stdin: make([]byte, MaxRequest)}); !errors.Is(err, ErrTooBig) {
		t.Errorf("oversized request: %v", err)
	}
	if _, err := AppendRequest(nil, Request{Env: make([]string, MaxEnv+1)}); !errors.Is(err, ErrTooMany) {
		t.Errorf("too many variables: %v", err)
	}
	for _, tt := range []struct {
		name string
		body []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"count only", []byte{0, 0, 0, 1}, ErrTruncated},
		{"string longer than the body", []byte{0, 0, 0, 1, 0, 0, 0, 9, 'a'}, ErrTruncated},
		{"huge string length", []byte{0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff}, ErrTruncated},
		{"too many variables", []byte{0, 0, 1, 0}, ErrTooMany},
		{"no stdin", []byte{0, 0, 0, 0}, ErrTruncated},
		{"trailing bytes", []byte{0, 0, 0, 0, 0, 0, 0, 0, 'x'}, ErrTrailing},
	} {
		if _, err := ParseRequest(tt.body); !errors.Is(err, tt.want) {
			t.Errorf("request %s: %v, want %v", tt.name, err, tt.want)
		}
	}
	for _, tt := range []struct {
		name string
		body []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"status only", []byte{0, 0, 0, 0}, ErrTruncated},
		{"unknown status", []byte{0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0}, ErrStatus},
		{"trailing bytes", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, ErrTrailing},
	} {
		if _, err := ParseReply(tt.body); !errors.Is(err, tt.want) {
			t.Errorf("reply %s: %v, want %v", tt.name, err, tt.want)
		}
	}
}

// FuzzFrames: decoding never panics, and what decodes encodes back to the
// same bytes.
func FuzzFrames(f *testing.F) {
	req, _ := AppendRequest(nil, Request{Env: []string{"CNI_COMMAND=ADD"}, Stdin: []byte("{}")})
	f.Add(req[HeaderLen:])
	f.Add(AppendReply(nil, Reply{Status: StatusError, Stdout: []byte("x"), Stderr: []byte("y")})[HeaderLen:])
	f.Fuzz(func(t *testing.T, body []byte) {
		if r, err := ParseRequest(body); err == nil {
			b, err := AppendRequest(nil, r)
			if err != nil {
				t.Fatalf("a decoded request does not encode: %v", err)
			}
			if !bytes.Equal(b[HeaderLen:], body) {
				t.Fatalf("request re-encodes as %x, was %x", b[HeaderLen:], body)
			}
		}
		if r, err := ParseReply(body); err == nil {
			if b := AppendReply(nil, r); !bytes.Equal(b[HeaderLen:], body) {
				t.Fatalf("reply re-encodes as %x, was %x", b[HeaderLen:], body)
			}
		}
	})
}
