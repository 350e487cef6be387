package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLILinkerdPod: render, trace and validate recognise a Linkerd pod by
// itself, say so, and trace it as linkerd-cni's rules send it: an app's
// outbound to :4140, inbound to an app port to :4143, and the proxy's UID,
// its admin and control ports and every skip port left alone.
func TestCLILinkerdPod(t *testing.T) {
	pod := filepath.Join("..", "..", "testdata", "pods", "linkerd.yaml")
	for _, tc := range []struct {
		args    []string
		verdict string
	}{
		{[]string{"out", "10.0.0.5:80"}, "verdict: redirect :4140"},
		{[]string{"out", "10.0.0.5:5432"}, "verdict: accept"}, // skip-outbound-ports
		{[]string{"--uid", "2102", "out", "10.0.0.5:80"}, "verdict: accept"},
		{[]string{"out", "127.0.0.1:8080"}, "verdict: accept"},
		{[]string{"in", "192.0.2.7:8080"}, "verdict: redirect :4143"},
		{[]string{"in", "192.0.2.7:4190"}, "verdict: accept"},          // the proxy's control port
		{[]string{"in", "192.0.2.7:4191"}, "verdict: accept"},          // its admin port
		{[]string{"in", "192.0.2.7:22"}, "verdict: accept"},            // skip-inbound-ports
		{[]string{"in", "192.0.2.7:8101"}, "verdict: accept"},          // a skipped range
		{[]string{"in", "192.0.2.7:15020"}, "verdict: redirect :4143"}, // no Istio port exceptions
	} {
		code, out, errOut := runCLI(t, append([]string{"trace", "-f", pod}, tc.args...)...)
		if code != exitOK || !strings.Contains(out, tc.verdict) || !strings.Contains(out, "a Linkerd pod") {
			t.Errorf("trace %v: exit %d, want %q and the mesh named:\n%s%s", tc.args, code, tc.verdict, out, errOut)
		}
	}
	code, out, errOut := runCLI(t, "render", "-f", pod)
	if code != exitOK || !strings.Contains(out, "redirect to :4140") || !strings.Contains(errOut, "a Linkerd pod") {
		t.Errorf("render: exit %d\n%s%s", code, out, errOut)
	}
}

// TestCLIBothProxies: a manifest with both proxies is refused, naming them.
func TestCLIBothProxies(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "pods", "linkerd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	both := strings.Replace(string(b), "  - name: web-svc\n", "  - name: istio-proxy\n    image: x\n  - name: web-svc\n", 1)
	p := filepath.Join(t.TempDir(), "both.yaml")
	if err := os.WriteFile(p, []byte(both), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, "render", "-f", p)
	if code != exitUsage || !strings.Contains(errOut, "istio-proxy and a linkerd-proxy") {
		t.Fatalf("render of a pod with both proxies: exit %d, %s", code, errOut)
	}
}
