package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/nftmesh/nftmesh/installer/conflist"
	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// withIstioCNI appends the entry Istio's installer chains (type istio-cni)
// to a conflist.
func withIstioCNI(t *testing.T, conflist []byte) []byte {
	t.Helper()
	var l map[string]any
	if err := json.Unmarshal(conflist, &l); err != nil {
		t.Fatal(err)
	}
	l["plugins"] = append(l["plugins"].([]any), map[string]any{
		"type": "istio-cni", "log_level": "info", "cni_agent_run_dir": "/var/run/istio-cni",
		"plugin_log_level": "info", "kubernetes": map[string]any{"kubeconfig": "/etc/cni/net.d/istio-cni-kubeconfig", "cni_bin_dir": "/opt/cni/bin", "exclude_namespaces": []string{"kube-system"}},
	})
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// With istio-cni in the primary's conflist, the agent does not insert
// itself (two capture plugins would fight): the file stays byte for byte,
// readiness is false and says why, the refusal is logged once and shown
// as a gauge. When istio-cni leaves, the agent inserts itself; when
// istio-cni comes back (a rollback), our entry is taken out again.
func TestRefusesNextToIstioCNI(t *testing.T) {
	h := newHost(t)
	p, orig := h.put(t, "10-calico.conflist", 0o644)
	both := withIstioCNI(t, orig)
	if err := os.WriteFile(p, both, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := h.config(t)
	var log lockedBuf
	in, err := New(cfg, zerolog.New(&log), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{in: in, cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- in.Run(ctx) }()
	t.Cleanup(a.stop)
	m := in.m
	gauge := func() float64 { return testutil.ToFloat64(m.ForeignCapture.WithLabelValues("istio-cni")) }

	var fe *ForeignCaptureError
	a.waitFor(t, "the refusal", func() bool { return errors.As(in.Ready(), &fe) })
	if fe.Plugin != "istio-cni" || fe.File != p || !strings.Contains(in.Ready().Error(), "two capture plugins") {
		t.Errorf("readiness error: %v", in.Ready())
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, both) {
		t.Errorf("the conflist was changed:\n%s", got)
	}
	if gauge() != 1 || testutil.ToFloat64(m.Ready) != 0 || testutil.ToFloat64(m.IstioReady) != 0 {
		t.Errorf("gauge %v, ready %v", gauge(), testutil.ToFloat64(m.Ready))
	}
	if !log.has("refusing to chain nftmesh-cni next to another capture plugin") || !log.has(`"plugin":"istio-cni"`) {
		t.Errorf("no refusal line:\n%s", log.String())
	}
	// Something else in the conf dir changes: no second line for the same refusal.
	select {
	case <-in.Reconciled:
	default:
	}
	_ = os.WriteFile(h.conf+"/README", []byte("x"), 0o644)
	select {
	case <-in.Reconciled:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconcile after a conf dir change")
	}
	if n := strings.Count(log.String(), "refusing to chain"); n != 1 {
		t.Errorf("%d refusal lines for one refusal", n)
	}

	// Istio's CNI is uninstalled: its entry goes, ours comes in.
	if err := os.WriteFile(p, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	a.waitReady(t)
	if gauge() != 0 {
		t.Errorf("gauge %v after istio-cni left", gauge())
	}
	if err := conflist.VerifyInstalled(p, cfg.PluginConf().JSON()); err != nil {
		t.Fatal(err)
	}

	// Rolled back: Istio's installer appends its entry after ours. Ours
	// is taken out, and the file keeps Istio's.
	cur, _ := os.ReadFile(p)
	if err := os.WriteFile(p, withIstioCNI(t, cur), 0o644); err != nil {
		t.Fatal(err)
	}
	// Our entry is stripped before the refusal is reported (gauge, log):
	// wait for the report too.
	a.waitFor(t, "the second refusal", func() bool {
		return errors.As(in.Ready(), &fe) && !conflist.HasPlugin(p, mustRead(t, p)) && gauge() == 1 && log.has(`"removed_ours":true`)
	})
	if conflist.ForeignCapture(p, mustRead(t, p)) != "istio-cni" || gauge() != 1 {
		t.Errorf("after the rollback: %s (gauge %v)", mustRead(t, p), gauge())
	}
	if !log.has(`"removed_ours":true`) {
		t.Error("the removal of our entry is not logged")
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type lockedBuf struct{ syncbuf.Buffer }

func (l *lockedBuf) has(s string) bool { return strings.Contains(l.String(), s) }

// withLinkerdCNI appends the entry linkerd2-cni's install script chains
// (type linkerd-cni, its chart's default settings) to a conflist.
func withLinkerdCNI(t *testing.T, conflist []byte) []byte {
	t.Helper()
	var l map[string]any
	if err := json.Unmarshal(conflist, &l); err != nil {
		t.Fatal(err)
	}
	l["plugins"] = append(l["plugins"].([]any), map[string]any{
		"name": "linkerd-cni", "type": "linkerd-cni", "log_level": "info",
		"kubernetes": map[string]any{"kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
		"linkerd": map[string]any{"incoming-proxy-port": 4143, "outgoing-proxy-port": 4140, "proxy-uid": 2102,
			"ports-to-redirect": []int{}, "inbound-ports-to-ignore": []string{"4191", "4190"},
			"simulate": false, "use-wait-flag": false, "iptables-mode": "nft", "ipv6": false},
	})
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// linkerd-cni's entry in the primary's conflist is refused as istio-cni's
// is: the file stays as it is, readiness and the gauge name linkerd-cni
// and the advice names Linkerd's DaemonSet; once it is gone the agent
// inserts itself, and when it comes back (a roll back to linkerd-cni)
// our entry is taken out.
func TestRefusesNextToLinkerdCNI(t *testing.T) {
	h := newHost(t)
	p, orig := h.put(t, "10-calico.conflist", 0o644)
	both := withLinkerdCNI(t, orig)
	if err := os.WriteFile(p, both, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := h.config(t)
	in, err := New(cfg, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agent{in: in, cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- in.Run(ctx) }()
	t.Cleanup(a.stop)
	gauge := func() float64 { return testutil.ToFloat64(in.m.ForeignCapture.WithLabelValues("linkerd-cni")) }

	var fe *ForeignCaptureError
	a.waitFor(t, "the refusal", func() bool { return errors.As(in.Ready(), &fe) && gauge() == 1 })
	msg := in.Ready().Error()
	if fe.Plugin != "linkerd-cni" || fe.File != p || !strings.Contains(msg, "uninstall Linkerd's CNI DaemonSet (linkerd2-cni)") {
		t.Errorf("readiness error: %v", msg)
	}
	if got := mustRead(t, p); !bytes.Equal(got, both) {
		t.Errorf("the conflist was changed:\n%s", got)
	}

	if err := os.WriteFile(p, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	a.waitReady(t)
	if err := conflist.VerifyInstalled(p, cfg.PluginConf().JSON()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, withLinkerdCNI(t, mustRead(t, p)), 0o644); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, "the refusal after the roll back", func() bool {
		return errors.As(in.Ready(), &fe) && !conflist.HasPlugin(p, mustRead(t, p)) && gauge() == 1
	})
	if got := conflist.ForeignCapture(p, mustRead(t, p)); got != "linkerd-cni" {
		t.Errorf("after the roll back the file chains %q:\n%s", got, mustRead(t, p))
	}
	if s := (&ForeignCaptureError{File: p, Plugin: "linkerd-cni", Standalone: true}).Error(); !strings.Contains(s, "uninstall Linkerd's CNI DaemonSet") {
		t.Errorf("standalone refusal: %s", s)
	}
}
