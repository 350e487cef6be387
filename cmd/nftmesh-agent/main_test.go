package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/rs/zerolog"
	"k8s.io/klog/v2"

	"github.com/nftmesh/nftmesh/installer"
)

// testVersion is stamped into the agent the tests build, as the Makefile
// stamps the real version.
const testVersion = "v0.0.0-agent-test"

// buildAgent compiles this command once per test binary.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nftmesh-agent")
	cmd := exec.Command("go", "build", "-ldflags=-X github.com/nftmesh/nftmesh/internal/version.Version="+testVersion, "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type fakeHost struct {
	root, bin, conf, run, sa, plugin string
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	r := t.TempDir()
	h := &fakeHost{root: r, bin: filepath.Join(r, "opt/cni/bin"), conf: filepath.Join(r, "etc/cni/net.d"),
		run: filepath.Join(r, "run/nftmesh"), sa: filepath.Join(r, "sa"), plugin: filepath.Join(r, "image/nftmesh-cni")}
	for _, d := range []string{h.bin, h.conf, h.sa, filepath.Dir(h.plugin)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Any executables stand in for the plugin and its companion: the agent
	// installs bytes.
	for _, name := range []string{installer.PluginName, installer.StandaloneName} {
		if err := os.WriteFile(filepath.Join(filepath.Dir(h.plugin), name), bytes.Repeat([]byte(name+"\n"), 4096), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.WriteFile(filepath.Join(h.sa, "token"), []byte("e2e-token"), 0o600)
	_ = os.WriteFile(filepath.Join(h.sa, "ca.crt"), []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), 0o644)
	return h
}

func (h *fakeHost) args(health, metrics string) []string {
	return []string{"--cni-bin-dir", h.bin, "--cni-conf-dir", h.conf, "--agent-run-dir", h.run,
		"--plugin-binary", h.plugin, "--service-account-dir", h.sa, "--health-addr", health, "--metrics-addr", metrics}
}

// snapshot records every file under root with its content and mode.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	_ = filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			out[p] = fmt.Sprintf("%v %x", fi.Mode(), b)
		} else {
			out[p] = fi.Mode().String()
		}
		return nil
	})
	return out
}

func httpGet(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The built agent against a temp "host": it becomes ready, chains itself
// into the bridge conflist, and on SIGTERM leaves the conflist
// byte-identical and removes its two binaries and kubeconfig.
func TestAgentBinaryEndToEnd(t *testing.T) {
	bin := buildAgent(t)
	h := newFakeHost(t)
	src, err := os.ReadFile(filepath.Join("..", "..", "testdata", "conflists", "1-k8s.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	primary := filepath.Join(h.conf, "1-k8s.conflist")
	if err := os.WriteFile(primary, src, 0o644); err != nil {
		t.Fatal(err)
	}
	health, metrics := freeAddr(t), freeAddr(t)
	var logs bytes.Buffer
	cmd := exec.Command(bin, h.args(health, metrics)...)
	cmd.Env = append(os.Environ(), "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=6443", "EXCLUDE_NAMESPACES=kube-system,istio-system")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("agent logs:\n%s", logs.String())
		}
	})

	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, _ := httpGet("http://" + health + "/readyz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent never became ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	l, err := libcni.ConfListFromFile(primary)
	if err != nil {
		t.Fatal(err)
	}
	last := l.Plugins[len(l.Plugins)-1]
	if last.Network.Type != "nftmesh-cni" || len(l.Plugins) != 5 || l.CNIVersion != "1.0.0" {
		t.Fatalf("installed conflist: %s", l.Bytes)
	}
	if !strings.Contains(string(last.Bytes), `"exclude_namespaces":["kube-system","istio-system"]`) {
		t.Errorf("Istio env not applied to the plugin entry: %s", last.Bytes)
	}
	if fi, err := os.Stat(filepath.Join(h.run, "kubeconfig")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig: %v", err)
	}
	for _, name := range []string{installer.PluginName, installer.StandaloneName} {
		want, _ := os.ReadFile(filepath.Join(filepath.Dir(h.plugin), name))
		if got, err := os.ReadFile(filepath.Join(h.bin, name)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s not installed in %s (%v)", name, h.bin, err)
		}
	}
	if code, body := httpGet("http://" + metrics + "/metrics"); code != 200 || !strings.Contains(body, "nftmesh_install_ready 1") {
		t.Errorf("/metrics %d: %.200s", code, body)
	}

	// A plugin run's log line, appended to the plugin's log file in the run
	// dir, shows up in the agent's own log.
	pf, err := os.OpenFile(filepath.Join(h.run, "nftmesh-cni.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pf.WriteString(`{"level":"info","plugin":"nftmesh-cni","command":"ADD","pod":"web-1","decision":"capture","time":"2026-01-02T03:04:05.678Z","message":"ADD capture"}` + "\n"); err != nil {
		t.Fatal(err)
	}
	pf.Close()
	deadline = time.Now().Add(10 * time.Second)
	for {
		_, body := httpGet("http://" + metrics + "/metrics")
		if strings.Contains(body, `nftmesh_plugin_events_total{command="ADD",decision="capture"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin's log line was never counted:\n%s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("agent exited with %v after SIGTERM", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("agent did not exit after SIGTERM")
	}
	if got, _ := os.ReadFile(primary); !bytes.Equal(got, src) {
		t.Errorf("conflist not restored byte for byte:\n%s", got)
	}
	for _, p := range []string{filepath.Join(h.bin, installer.PluginName), filepath.Join(h.bin, installer.StandaloneName), filepath.Join(h.run, "kubeconfig")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind", p)
		}
	}
	if !strings.Contains(logs.String(), `"message":"cleanup done"`) {
		t.Errorf("no cleanup log line")
	}
	var starting string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"message":"starting"`) {
			starting = line
		}
	}
	if !strings.Contains(starting, `"version":"`+testVersion+`"`) {
		t.Errorf("the start line %q does not carry the version %s", starting, testVersion)
	}
	if want := `{"level":"info","time":"2026-01-02T03:04:05.678Z","component":"cni-plugin","plugin":"nftmesh-cni","command":"ADD","pod":"web-1","decision":"capture","message":"ADD capture"}`; !strings.Contains(logs.String(), want) {
		t.Errorf("the plugin's line is not in the agent's log as\n%s", want)
	}
}

// --version prints the stamped version and exits before reading any
// configuration (none is given here, which would otherwise be exit 2).
func TestAgentVersion(t *testing.T) {
	bin := buildAgent(t)
	cmd := exec.Command(bin, "--version")
	cmd.Env = []string{"KUBERNETES_SERVICE_HOST="}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("--version: %v\n%s", err, out)
	}
	if want := "nftmesh-agent " + testVersion + " (go"; !strings.HasPrefix(string(out), want) {
		t.Errorf("--version printed %q, want it to start with %q", out, want)
	}
}

// Bad configuration exits 2 with a message naming the flag, and touches
// no host file.
func TestAgentBinaryBadConfigTouchesNothing(t *testing.T) {
	bin := buildAgent(t)
	cases := []struct {
		name  string
		extra []string
		env   []string
		want  string
		// spoil changes the fake host after it is made.
		spoil func(h *fakeHost)
	}{
		{"bad backend", []string{"--backend", "nft"}, nil, "--backend", nil},
		{"bad env", nil, []string{"CHAINED_CNI_PLUGIN=perhaps"}, "CHAINED_CNI_PLUGIN", nil},
		{"missing plugin", []string{"--plugin-binary", "/nonexistent/nftmesh-cni"}, nil, "--plugin-binary", nil},
		{name: "missing companion", want: "/image/" + installer.StandaloneName, spoil: func(h *fakeHost) {
			_ = os.Remove(filepath.Join(filepath.Dir(h.plugin), installer.StandaloneName))
		}},
		{"repair in place without host proc", []string{"--repair-enabled", "--repair-pods", "--node-name", "n", "--host-proc", "/nonexistent/proc"}, nil, "--host-proc", nil},
		{"no api server", nil, []string{"KUBERNETES_SERVICE_HOST="}, "--kube-api-server", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newFakeHost(t)
			if c.spoil != nil {
				c.spoil(h)
			}
			_ = os.WriteFile(filepath.Join(h.conf, "10-x.conflist"), []byte(`{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"bridge"}]}`), 0o644)
			before := snapshot(t, h.root)
			cmd := exec.Command(bin, append(h.args("127.0.0.1:0", "127.0.0.1:0"), c.extra...)...)
			cmd.Env = append(append(os.Environ(), "KUBERNETES_SERVICE_HOST=127.0.0.1"), c.env...)
			out, err := cmd.CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2\n%s", err, out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("message does not mention %q:\n%s", c.want, out)
			}
			after := snapshot(t, h.root)
			if fmt.Sprint(before) != fmt.Sprint(after) {
				t.Errorf("host files changed on bad config")
			}
		})
	}
}

// --log-format text (the chart's global.logAsJson=false) writes plain
// lines; the default stays one JSON object per line.
func TestLogFormat(t *testing.T) {
	var j, txt bytes.Buffer
	for w, format := range map[*bytes.Buffer]string{&j: "json", &txt: "text"} {
		l := newLogger(w, format)
		l.Info().Str("file", "/etc/cni/net.d/10-x.conflist").Msg("inserted")
	}
	if !strings.HasPrefix(j.String(), "{") || !strings.Contains(j.String(), `"message":"inserted"`) {
		t.Errorf("json line %q", j.String())
	}
	line := txt.String()
	if strings.HasPrefix(line, "{") || !strings.Contains(line, "INF inserted") || !strings.Contains(line, "file=/etc/cni/net.d/10-x.conflist") || strings.Contains(line, "\x1b[") {
		t.Errorf("text line %q", line)
	}
}

// TestKlogIntoAgentLog: client-go's klog entries come out in the agent's
// own format and level, with its fields, in JSON and in text.
func TestKlogIntoAgentLog(t *testing.T) {
	t.Cleanup(klog.ClearLogger)
	var j bytes.Buffer
	agentLogger(&j, "json", zerolog.InfoLevel)
	klog.Errorf("watch of *v1.Pod ended with: %s", "too old resource version")
	klog.V(3).Info("too detailed")
	klog.Flush()
	var m map[string]any
	if err := json.Unmarshal(j.Bytes(), &m); err != nil || strings.Count(j.String(), "\n") != 1 {
		t.Fatalf("want one JSON line, got %q (%v)", j.String(), err)
	}
	if m["component"] != "nftmesh-agent" || m["logger"] != "client-go" || m["level"] != "error" || m["message"] != "watch of *v1.Pod ended with: too old resource version" {
		t.Errorf("klog line %q", j.String())
	}

	var txt bytes.Buffer
	agentLogger(&txt, "text", zerolog.ErrorLevel)
	klog.Info("below the agent's level")
	klog.Error("throttled")
	if line := txt.String(); strings.Count(line, "\n") != 1 || !strings.Contains(line, "ERR throttled") || !strings.Contains(line, "logger=client-go") {
		t.Errorf("text line %q", line)
	}
}

// TestKlogStructured: klog entries of every kind client-go emits come out
// as the agent's JSON lines with their fields (structured values, the
// error, a contextual logger's name and values), nothing reaches stderr.
func TestKlogStructured(t *testing.T) {
	t.Cleanup(klog.ClearLogger)
	var buf bytes.Buffer
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	agentLogger(&buf, "json", zerolog.InfoLevel)
	klog.ErrorS(errors.New("unexpected EOF"), "Unexpected error when reading response body", "url", "https://api/pods")
	klog.Errorf("plain %s", "errorf")
	klog.Warning("a warning")
	klog.InfoS("structured info", "count", 3)
	klog.V(4).Info("too detailed")
	klog.Background().WithName("reflector").WithValues("type", "Pod").Info("contextual")
	klog.Flush()
	os.Stderr = old
	w.Close()
	if stderr := <-done; stderr != "" {
		t.Errorf("klog still wrote to stderr: %q", stderr)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		if m["component"] != "nftmesh-agent" || !strings.HasPrefix(fmt.Sprint(m["logger"]), "client-go") {
			t.Errorf("line without the agent's fields: %q", l)
		}
		lines = append(lines, m)
	}
	want := []map[string]any{
		{"level": "error", "message": "Unexpected error when reading response body", "error": "unexpected EOF", "url": "https://api/pods"},
		{"level": "error", "message": "plain errorf"},
		{"level": "info", "message": "a warning"},
		{"level": "info", "message": "structured info", "count": float64(3)},
		{"level": "info", "message": "contextual", "type": "Pod", "logger": "client-go/reflector"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		for k, v := range w {
			if lines[i][k] != v {
				t.Errorf("line %d: %s = %v, want %v", i, k, lines[i][k], v)
			}
		}
	}
}

// TestKlogLevels: what reaches the agent's log follows its level. klog's
// own functions keep klog's verbosity (0: klog.V(1) is dropped); a
// contextual logger's V(1) is debug (logr's mapping, zerologr's), shown at
// --log-level debug only, and V(2) and up (trace) never.
func TestKlogLevels(t *testing.T) {
	t.Cleanup(klog.ClearLogger)
	for _, tc := range []struct {
		level zerolog.Level
		want  []string
	}{
		{zerolog.DebugLevel, []string{"v0", "v1", "e"}},
		{zerolog.InfoLevel, []string{"v0", "e"}},
		{zerolog.ErrorLevel, []string{"e"}},
		{zerolog.Disabled, nil},
	} {
		var buf bytes.Buffer
		agentLogger(&buf, "json", tc.level)
		klog.Background().Info("v0")
		klog.Background().V(1).Info("v1")
		klog.Background().V(2).Info("v2: trace, below debug")
		klog.V(1).Info("klog.V(1): klog's verbosity drops it")
		klog.Error("e")
		klog.Flush()
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var m struct{ Message string }
			if l != "" && json.Unmarshal([]byte(l), &m) == nil {
				got = append(got, m.Message)
			}
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("level %v: logged %q, want %q", tc.level, got, tc.want)
		}
	}
}
