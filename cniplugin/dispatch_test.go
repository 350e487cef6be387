package cniplugin

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// outcome is what one CNI invocation did: the verb it reached with which
// arguments, what it printed, and the error it returns.
type outcome struct {
	called         string
	args           cmdArgs
	stdout, stderr string
	err            string
}

func errString(e *types.Error) string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf("code %d msg %q details %q", e.Code, e.Msg, e.Details)
}

// viaDispatch runs our dispatcher on vars and stdin with verbs that record
// their call (and return verbErr).
func viaDispatch(vars map[string]string, stdin []byte, verbErr error) outcome {
	var o outcome
	rec := func(name string) func(*cmdArgs) error {
		return func(a *cmdArgs) error { o.called, o.args = name, *a; return verbErr }
	}
	var out, errb bytes.Buffer
	e := dispatch(cniEnv{getenv: func(k string) string { return vars[k] }, stdin: bytes.NewReader(stdin), stdout: &out, stderr: &errb},
		skel.CNIFuncs{Add: rec("ADD"), Check: rec("CHECK"), Del: rec("DEL"), GC: rec("GC"), Status: rec("STATUS")}, supportedVersions, "about nftmesh-cni")
	o.stdout, o.stderr, o.err = out.String(), errb.String(), errString(e)
	return o
}

// viaSkel runs the CNI library's skel on the same input, through the
// process environment and stdio it reads.
func viaSkel(t testing.TB, vars map[string]string, stdin []byte, verbErr error) outcome {
	var o outcome
	rec := func(name string) func(*skel.CmdArgs) error {
		return func(a *skel.CmdArgs) error {
			o.called, o.args = name, *a
			return verbErr
		}
	}
	for _, k := range envOrder {
		old, had := os.LookupEnv(k)
		if v, ok := vars[k]; ok {
			os.Setenv(k, v)
		} else {
			os.Unsetenv(k)
		}
		defer func() {
			if had {
				os.Setenv(k, old)
			} else {
				os.Unsetenv(k)
			}
		}()
	}
	inR, inW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	go func() { _, _ = inW.Write(stdin); inW.Close() }()
	outc, errc := make(chan []byte), make(chan []byte)
	go func() { b, _ := io.ReadAll(outR); outc <- b }()
	go func() { b, _ := io.ReadAll(errR); errc <- b }()
	oldIn, oldOut, oldErr := os.Stdin, os.Stdout, os.Stderr
	os.Stdin, os.Stdout, os.Stderr = inR, outW, errW
	e := skel.PluginMainFuncsWithError(skel.CNIFuncs{Add: rec("ADD"), Check: rec("CHECK"), Del: rec("DEL"), GC: rec("GC"), Status: rec("STATUS")},
		supportedVersions, "about nftmesh-cni")
	os.Stdin, os.Stdout, os.Stderr = oldIn, oldOut, oldErr
	outW.Close()
	errW.Close()
	inR.Close()
	o.stdout, o.stderr, o.err = string(<-outc), string(<-errc), errString(e)
	return o
}

func sameOutcome(t testing.TB, what string, vars map[string]string, stdin []byte, verbErr error) {
	t.Helper()
	ours, theirs := viaDispatch(vars, stdin, verbErr), viaSkel(t, vars, stdin, verbErr)
	if ours.called != theirs.called || ours.stdout != theirs.stdout || ours.stderr != theirs.stderr || ours.err != theirs.err ||
		fmt.Sprint(ours.args) != fmt.Sprint(theirs.args) {
		t.Errorf("%s: vars %v stdin %q\nours: %+v\nskel: %+v", what, vars, stdin, ours, theirs)
	}
}

// TestDispatchMatchesSkel: for every verb and every kind of bad input, our
// dispatcher reaches the same verb with the same arguments, prints the same
// and returns the same error as the CNI library's skel. (skel also looks
// at CNI_NETNS again after ADD and DEL; CNI_NETNS_OVERRIDE=1 turns that off
// here, and hostns_test.go proves the plugin refuses its own namespace
// before it does anything.)
func TestDispatchMatchesSkel(t *testing.T) {
	full := func(cmd string) map[string]string {
		return map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": "ctr-1", "CNI_NETNS": "/run/netns/x", "CNI_IFNAME": "eth0",
			"CNI_ARGS": "K8S_POD_NAME=a", "CNI_PATH": "/opt/cni/bin", "CNI_NETNS_OVERRIDE": "1"}
	}
	with := func(cmd, k, v string) map[string]string { m := full(cmd); m[k] = v; return m }
	without := func(cmd string, ks ...string) map[string]string {
		m := full(cmd)
		for _, k := range ks {
			delete(m, k)
		}
		return m
	}
	conf := func(v string) []byte {
		return []byte(`{"cniVersion":"` + v + `","name":"k8s-pod-network","type":"nftmesh-cni"}`)
	}
	verbsAll := []string{"ADD", "CHECK", "DEL", "GC", "STATUS", "VERSION", "BOGUS", ""}
	for _, cmd := range verbsAll {
		for _, v := range []string{"", "0.1.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "1.2.0", "x.y", "1.0"} {
			sameOutcome(t, cmd+" version "+v, full(cmd), conf(v), nil)
		}
		for _, stdin := range []string{``, `{`, `[]`, `{"cniVersion":"1.0.0"}`, `{"cniVersion":"1.0.0","name":""}`,
			`{"cniVersion":"1.0.0","name":"-bad"}`, `{"cniVersion":"1.0.0","name":"a b"}`, `{"cniVersion":"1.0.0","name":"ok.name_1-x"}`,
			`{"cniVersion":1,"name":"n"}`, `{"cniVersion":"1.0.0","name":7}`} {
			sameOutcome(t, cmd+" stdin "+stdin, full(cmd), []byte(stdin), nil)
		}
		for _, k := range envOrder {
			sameOutcome(t, cmd+" without "+k, without(cmd, k), conf("1.0.0"), nil)
		}
		sameOutcome(t, cmd+" without any", without(cmd, envOrder...), conf("1.0.0"), nil)
		for _, id := range []string{"-x", "_x", "a/b", "a b", "ä", "ok-1.2_3", "x\n"} {
			sameOutcome(t, cmd+" container id "+id, with(cmd, "CNI_CONTAINERID", id), conf("1.0.0"), nil)
		}
		for _, ifn := range []string{".", "..", "a/b", "a:b", "a b", "a\u00a0b", "a\u2003b", strings.Repeat("e", 15), strings.Repeat("e", 16), "\xff"} {
			sameOutcome(t, cmd+" ifname "+ifn, with(cmd, "CNI_IFNAME", ifn), conf("1.0.0"), nil)
		}
		sameOutcome(t, cmd+" verb error", full(cmd), conf("1.1.0"), types.NewError(104, "msg", "details"))
		sameOutcome(t, cmd+" wrapped verb error", full(cmd), conf("1.1.0"), fmt.Errorf("wrapped: %w", types.NewError(102, "m", "d")))
		sameOutcome(t, cmd+" plain verb error", full(cmd), conf("1.1.0"), fmt.Errorf("plain"))
	}
	// No command and an about text: the about text, no error.
	sameOutcome(t, "about", map[string]string{}, nil, nil)
}

// FuzzDispatchMatchesSkel: any command, IDs, interface name and config give
// the same outcome from our dispatcher as from skel.
func FuzzDispatchMatchesSkel(f *testing.F) {
	f.Add("ADD", "ctr-1", "eth0", `{"cniVersion":"1.0.0","name":"n"}`)
	f.Add("CHECK", "-x", "eth0", `{"cniVersion":"0.3.1","name":"n"}`)
	f.Add("GC", "ctr", "", `{"cniVersion":"1.1.0","name":"n"}`)
	f.Add("STATUS", "", "a b", `{"name":"n"}`)
	f.Add("VERSION", "c", "e", `garbage`)
	f.Fuzz(func(t *testing.T, cmd, id, ifname, stdin string) {
		vars := map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": id, "CNI_NETNS": "/run/netns/x", "CNI_IFNAME": ifname,
			"CNI_PATH": "/opt/cni/bin", "CNI_NETNS_OVERRIDE": "1"}
		for k, v := range vars {
			if strings.ContainsRune(k+v, 0) {
				return // the environment cannot hold NUL
			}
		}
		sameOutcome(t, "fuzz", vars, []byte(stdin), nil)
	})
}
