package cniplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/podinfo/agentsock"
	"github.com/nftmesh/nftmesh/testkit/capturetest"
)

// TestAgentDeclinesWhenStarved: run by the agent, a call that meets the
// agent's lack of a resource (EMFILE, ENFILE, ENOMEM, ENOBUFS) is declined,
// for the standalone plugin to run from scratch, wherever the namespace is
// as the call found it: before anything is written (opening the namespace,
// listing its addresses, entering it), or after a failed write into a
// namespace that held nothing of ours, once the clean-up removed what it
// left. A failed write whose clean-up failed too, or over an earlier run's
// rules, fails the call as before, and so does the standalone plugin
// itself: there is nobody to decline to. DEL and CHECK end the same from
// any state, and decline wherever they starve. Before, every one of these
// was the call's CNI error ("opening netns ...: too many open files").
// (Root-free: the kernel is the in-memory one, its failures injected.)
func TestAgentDeclinesWhenStarved(t *testing.T) {
	pod := loadPod(t, "injected.yaml")
	pod.UID = "uid-starved"
	found := foundAnswer(t, pod)
	plan := wantPlan(t, pod, false)
	for _, tt := range []struct {
		name   string
		verb   string
		errno  unix.Errno
		setUp  func(f *capturetest.Fake, err error)
		agent  bool
		before bool // an earlier run's rules are there
		// want: "declined", or the CNI error code of a call that fails;
		// left: whether our rules are there afterwards.
		want string
		left bool
	}{
		{"ADD open", "ADD", unix.EMFILE, kernelFault(capturetest.OpOpen), true, false, "declined", false},
		{"ADD open, system table", "ADD", unix.ENFILE, kernelFault(capturetest.OpOpen), true, false, "declined", false},
		{"ADD addresses", "ADD", unix.ENOBUFS, kernelFault(capturetest.OpAddrs), true, false, "declined", false},
		{"ADD enter", "ADD", unix.EMFILE, kernelFault(capturetest.OpEnter), true, false, "declined", false},
		{"ADD enter over earlier rules", "ADD", unix.ENOMEM, kernelFault(capturetest.OpEnter), true, true, "declined", true},
		{"ADD write, cleaned up", "ADD", unix.ENOMEM, func(f *capturetest.Fake, err error) { f.FailApply("", err, true) }, true, false, "declined", false},
		{"ADD write, clean-up failed", "ADD", unix.ENOBUFS, func(f *capturetest.Fake, err error) {
			f.FailApply("", err, true)
			f.FailRemove("", err)
		}, true, false, "102", true},
		{"ADD write over earlier rules", "ADD", unix.ENOMEM, func(f *capturetest.Fake, err error) { f.FailApply("", err, true) }, true, true, "102", true},
		{"ADD open, standalone", "ADD", unix.EMFILE, kernelFault(capturetest.OpOpen), false, false, "4", false},
		{"DEL open", "DEL", unix.EMFILE, kernelFault(capturetest.OpOpen), true, true, "declined", true},
		{"DEL enter", "DEL", unix.EMFILE, kernelFault(capturetest.OpEnter), true, true, "declined", true},
		{"DEL remove", "DEL", unix.ENOBUFS, func(f *capturetest.Fake, err error) { f.FailRemove("", err) }, true, true, "declined", true},
		{"DEL remove, standalone", "DEL", unix.ENOBUFS, func(f *capturetest.Fake, err error) { f.FailRemove("", err) }, false, true, "5", true},
		{"CHECK open", "CHECK", unix.EMFILE, kernelFault(capturetest.OpOpen), true, true, "declined", true},
		{"CHECK list", "CHECK", unix.ENOMEM, func(f *capturetest.Fake, err error) { f.FailList("", err) }, true, true, "declined", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := capturetest.New()
			f.AddNetns(fakeNetns, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("198.51.100.20"))
			if tt.before {
				f.Install(fakeNetns, "nftables", plan)
			}
			tt.setUp(f, fmt.Errorf("doing it: %w", tt.errno))
			runDir, _ := fakeAPIRunDir(t, servePod(t, pod))
			vars := cniVars(tt.verb, fakeNetns, "ctr-starved", cniArgsFor(pod, "ctr-starved"))
			var out, errOut bytes.Buffer
			e := Env{
				Getenv:   func(k string) string { return vars[k] },
				Stdin:    bytes.NewReader(directConf(t, "1.0.0", runDir, prevResultV4("1.0.0", "198.51.100.20/24"), nil)),
				Stdout:   &out,
				Stderr:   &errOut,
				Pipeline: f.Pipeline(),
			}
			if tt.agent {
				e.Ask = func(agentsock.Request) (agentsock.Answer, error) { return found, nil }
				e.RunDir = runDir
			}
			code, err := Run(e)
			switch {
			case tt.want == "declined":
				if !errors.Is(err, ErrDeclined) || agentsock.StarvedOf(err) == "" {
					t.Fatalf("status %d, %v, stdout %q; want declined for lack of a resource", code, err, out.String())
				}
				if !strings.Contains(err.Error(), tt.errno.Error()) {
					t.Errorf("the decline %q does not say why (%s)", err, tt.errno)
				}
			default:
				var cerr types.Error
				if code != 1 || err != nil || json.Unmarshal(out.Bytes(), &cerr) != nil || fmt.Sprint(cerr.Code) != tt.want {
					t.Fatalf("status %d, %v, stdout %q; want CNI error %s", code, err, out.String(), tt.want)
				}
			}
			if left := len(f.Backends(fakeNetns)) != 0; left != tt.left {
				t.Errorf("our rules there afterwards: %t, want %t:\n%s", left, tt.left, f.Dump(fakeNetns))
			}
		})
	}
}

func kernelFault(op string) func(*capturetest.Fake, error) {
	return func(f *capturetest.Fake, err error) { f.FailKernel(op, err) }
}
