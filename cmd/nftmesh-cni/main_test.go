package main

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/internal/cnisock"
	"github.com/nftmesh/nftmesh/testkit/nstest"
)

// TestStandaloneRunsWithOneP: when the agent does not take the call, the
// front runs its companion with GOMAXPROCS=1 in the environment (so the
// plugin's runtime starts with one P), unless the runtime's environment
// names a GOMAXPROCS, which is kept. The companion here is a script beside
// a freshly built front that prints what it got; the run dir has no agent
// socket.
func TestStandaloneRunsWithOneP(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the front")
	}
	dir := t.TempDir()
	front := buildFront(t, dir)
	companion := "#!/bin/sh\necho \"GOMAXPROCS=${GOMAXPROCS-unset} CNI_COMMAND=$CNI_COMMAND stdin=$(cat)\"\n"
	if err := os.WriteFile(filepath.Join(dir, StandaloneName), []byte(companion), 0o755); err != nil {
		t.Fatal(err)
	}
	runDir := t.TempDir() // no agent-sock/cni.sock: the agent is down
	config := `{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"nftmesh-cni","agent_run_dir":"` + runDir + `"}`
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"unset", nil, "GOMAXPROCS=1 "},
		{"set by the runtime", []string{"GOMAXPROCS=3"}, "GOMAXPROCS=3 "},
		{"set empty", []string{"GOMAXPROCS="}, "GOMAXPROCS= "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, verb := range []string{"ADD", "VERSION", ""} {
				cmd := exec.Command(front)
				cmd.Env = append([]string{"CNI_COMMAND=" + verb, "PATH=/usr/bin:/bin"}, tc.env...)
				cmd.Stdin = strings.NewReader(config)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("%s: %v\n%s", verb, err, out)
				}
				got := string(out)
				if !strings.HasPrefix(got, tc.want+"CNI_COMMAND="+verb+" ") || !strings.Contains(got, `"agent_run_dir"`) {
					t.Errorf("%s: the companion got %q, want %q with the CNI_COMMAND and the config", verb, got, tc.want)
				}
			}
		})
	}
}

// TestFrontErrorsAreCNIErrors: a front that cannot go on fails the call as
// the CNI spec says: exit 1 and, on stdout, one error object. Without its
// companion beside it (and no agent) the code is 11 and msg names the
// missing binary, quoted as JSON although the path holds a quote, a
// backslash and a tab; a stdin it cannot read (a directory) is code 5.
func TestFrontErrorsAreCNIErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the front")
	}
	dir := filepath.Join(t.TempDir(), "a \"quoted\\ dir\twith a tab")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	front := buildFront(t, dir)
	config := `{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"nftmesh-cni","agent_run_dir":"` + t.TempDir() + `"}`
	notDir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer notDir.Close()
	missing := "nftmesh-cni: cannot run " + filepath.Join(dir, StandaloneName) +
		" (the nftmesh agent installs it beside nftmesh-cni; the pod is not started without its capture)"
	for _, tc := range []struct {
		name, verb  string
		stdin       io.Reader
		code        int
		msg, detail string
	}{
		{"ADD, no companion", "ADD", strings.NewReader(config), 11, missing, "no such file or directory"},
		{"about text, no companion", "", strings.NewReader(config), 11, missing, "no such file or directory"},
		{"stdin a directory", "ADD", notDir, 5, "nftmesh-cni: reading the config from stdin", "is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(front)
			cmd.Env = []string{"CNI_COMMAND=" + tc.verb, "PATH=/usr/bin:/bin"}
			cmd.Stdin = tc.stdin
			var stdout strings.Builder
			cmd.Stdout = &stdout
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("%v, want exit status 1; stdout %q", err, stdout.String())
			}
			var got struct {
				Code    int    `json:"code"`
				Msg     string `json:"msg"`
				Details string `json:"details"`
			}
			dec := json.NewDecoder(strings.NewReader(stdout.String()))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&got); err != nil || dec.More() {
				t.Fatalf("stdout %q is not one CNI error object: %v", stdout.String(), err)
			}
			if got.Code != tc.code || got.Msg != tc.msg || !strings.HasSuffix(got.Details, tc.detail) {
				t.Errorf("got %+v, want code %d, msg %q, details ending %q", got, tc.code, tc.msg, tc.detail)
			}
		})
	}
}

// buildFront builds the front into dir.
func buildFront(t *testing.T, dir string) string {
	t.Helper()
	front := filepath.Join(dir, "nftmesh-cni")
	build := exec.Command("go", "build", "-o", front, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the front: %v\n%s", err, out)
	}
	return front
}

// TestAnswerOfAnAgentThatClosedAtOnce: the agent answers and closes as soon
// as it has read the call, which it may do before the front's sendmsg has
// even returned; the front still prints that answer, and runs no
// standalone plugin. strace holds the front 200 ms on its way back from
// sendmsg (fault injection), so the agent has always closed by then: a
// front that wrote again once all was sent (a write of nothing) got EPIPE
// there and fell back (BenchmarkFrontAddAgent saw it once in 60 ADDs).
func TestAnswerOfAnAgentThatClosedAtOnce(t *testing.T) {
	nstest.NeedRoot(t) // the front talks only to root's agent
	if testing.Short() {
		t.Skip("-short: builds the front")
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("strace (its fault injection holds the front after sendmsg) is not installed")
	}
	dir := t.TempDir()
	front := buildFront(t, dir)
	companion := "#!/bin/sh\necho standalone ran\n"
	if err := os.WriteFile(filepath.Join(dir, StandaloneName), []byte(companion), 0o755); err != nil {
		t.Fatal(err)
	}
	runDir := t.TempDir()
	if err := os.Mkdir(filepath.Join(runDir, "agent-sock"), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: cnisock.Path(runDir), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() { served <- answerOnce(ln, []byte(`{"cniVersion":"1.0.0"}`)) }()
	config := `{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"nftmesh-cni","agent_run_dir":"` + runDir + `"}`
	cmd := exec.Command(strace, "-qq", "-f", "-o", "/dev/null", "-e", "trace=sendmsg", "-e", "inject=sendmsg:delay_exit=200000", front)
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=ctr-1", "CNI_IFNAME=eth0", "PATH=/usr/bin:/bin"}
	cmd.Stdin = strings.NewReader(config)
	out, err := cmd.CombinedOutput()
	if serr := <-served; serr != nil {
		t.Fatalf("the agent: %v", serr)
	}
	if err != nil || string(out) != `{"cniVersion":"1.0.0"}` {
		t.Fatalf("front: %v, output %q; want the agent's answer and exit 0", err, out)
	}
}

// answerOnce is an agent that takes one call, answers it with result at
// once and closes.
func answerOnce(ln *net.UnixListener, result []byte) error {
	c, err := ln.AcceptUnix()
	if err != nil {
		return err
	}
	defer c.Close()
	var hdr [cnisock.HeaderLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	n, err := cnisock.BodyLen(hdr, cnisock.RequestMagic)
	if err != nil {
		return err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return err
	}
	if _, err := cnisock.ParseRequest(body); err != nil {
		return err
	}
	_, err = c.Write(cnisock.AppendReply(nil, cnisock.Reply{Status: cnisock.StatusOK, Stdout: result}))
	return err
}
