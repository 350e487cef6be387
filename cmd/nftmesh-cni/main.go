// Command nftmesh-cni is what the CNI conflist names: a front process that
// hands the whole CNI call to the node agent, which runs nftmesh's plugin
// (cniplugin) in its own warm process with the pod from its
// informer, and prints what the plugin printed. The call's CNI_* variables
// and config go over the agent's root-only unix socket, the pod's network
// namespace as a descriptor beside them.
//
// Whenever the agent does not take the call (no socket, no answer in
// time, an answer it declines to give), the front runs
// nftmesh-cni-standalone from its own directory in its place (execve, same
// environment, the config on stdin): the whole plugin in one process, which
// looks the pod up and programs the rules itself, as a plugin without an
// agent does. Either way the call fails closed.
//
// The front does little, on the standard library's os, io and
// encoding/json (it reads the config's agent_run_dir as the plugin does).
// It speaks the socket with a few system calls rather than package net,
// which measured more page faults per pod start and no fewer lines
// (docs/dependencies.md, "The front and its socket").
//
//go:debug updatemaxprocs=0
package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/internal/cnisock"
)

// StandaloneName is the companion the front runs when the agent does not
// take a call; the agent installs it beside the front.
const StandaloneName = "nftmesh-cni-standalone"

// agentTimeout bounds the wait for the agent's answer. An ADD the agent
// takes is milliseconds, or up to a second for a pod its informer has not
// seen yet; past this the standalone plugin runs the call instead (the
// namespace's lock orders the two should the agent still be at it).
const agentTimeout = 10 * time.Second

func main() {
	env := os.Environ()
	// No CNI_COMMAND (the about text, --version) or arguments: nothing for
	// the agent; stdin is left for the standalone plugin as it is.
	if os.Getenv("CNI_COMMAND") == "" || len(os.Args) > 1 {
		standalone(nil, env)
	}
	stdin, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(5, "nftmesh-cni: reading the config from stdin", err)
	}
	if reply, ok := ask(stdin, env); ok {
		os.Stdout.Write(reply.Stdout)
		os.Stderr.Write(reply.Stderr)
		os.Exit(int(reply.Status))
	}
	standalone(stdin, env)
}

// ask hands the call to the agent and returns its reply; ok is false when
// the agent did not take the call.
func ask(stdin []byte, env []string) (cnisock.Reply, bool) {
	var none cnisock.Reply
	dir, ok := cnisock.RunDir(stdin)
	if !ok {
		return none, false
	}
	var vars []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "CNI_") {
			vars = append(vars, kv)
		}
	}
	frame, err := cnisock.AppendRequest(nil, cnisock.Request{Env: vars, Stdin: stdin})
	if err != nil {
		return none, false
	}
	// The namespace goes as a descriptor: the agent's mount namespace need
	// not see the runtime's netns path. O_PATH opens anything without
	// blocking or acting on it; the agent checks what it is.
	var rights []byte
	if p := os.Getenv("CNI_NETNS"); p != "" {
		nfd, err := syscall.Open(p, unix.O_PATH|syscall.O_CLOEXEC, 0)
		if err != nil {
			return none, false
		}
		defer syscall.Close(nfd)
		rights = syscall.UnixRights(nfd)
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return none, false
	}
	// A blocking socket: the runtime starts no poller, and the socket
	// timeouts bound each wait.
	sock := os.NewFile(uintptr(fd), "agent socket")
	defer sock.Close()
	tv := syscall.NsecToTimeval(agentTimeout.Nanoseconds())
	if syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &tv) != nil ||
		syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv) != nil {
		return none, false
	}
	if syscall.Connect(fd, &syscall.SockaddrUnix{Name: cnisock.Path(dir)}) != nil {
		return none, false
	}
	// Only root's agent: the socket's directory is root's alone, and this
	// checks the process that listens is too.
	if cred, err := syscall.GetsockoptUcred(fd, syscall.SOL_SOCKET, syscall.SO_PEERCRED); err != nil || cred.Uid != 0 {
		return none, false
	}
	n, err := syscall.SendmsgN(fd, frame, rights, nil, syscall.MSG_NOSIGNAL)
	if err != nil {
		return none, false
	}
	// Nothing is written once all is sent: the agent may have answered and
	// closed, and even a write of nothing would fail (EPIPE).
	if n < len(frame) {
		if _, err := sock.Write(frame[n:]); err != nil {
			return none, false
		}
	}
	var hdr [cnisock.HeaderLen]byte
	if _, err := io.ReadFull(sock, hdr[:]); err != nil {
		return none, false
	}
	size, err := cnisock.BodyLen(hdr, cnisock.ReplyMagic)
	if err != nil {
		return none, false
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(sock, body); err != nil {
		return none, false
	}
	reply, err := cnisock.ParseReply(body)
	if err != nil || reply.Status == cnisock.StatusDeclined {
		return none, false
	}
	return reply, true
}

// standalone replaces this process with the standalone plugin, the config
// (when read) on its stdin again. It returns only by exiting.
func standalone(stdin []byte, env []string) {
	self, err := os.Executable()
	if err != nil {
		fail(11, "nftmesh-cni: finding its own binary to run "+StandaloneName+" beside it", err)
	}
	bin := filepath.Join(filepath.Dir(self), StandaloneName)
	if stdin != nil {
		// A memory file with the config, as stdin: read by the plugin like
		// the runtime's pipe, whatever its size.
		if err := stdinFrom(stdin); err != nil {
			fail(5, "nftmesh-cni: handing the config to "+StandaloneName, err)
		}
	}
	argv := append([]string{bin}, os.Args[1:]...)
	err = syscall.Exec(bin, argv, standaloneEnv(env))
	fail(11, "nftmesh-cni: cannot run "+bin+" (the nftmesh agent installs it beside nftmesh-cni; the pod is not started without its capture)", err)
}

// stdinFrom makes stdin a memory file holding config (closed on exec; dup'ed
// onto stdin it is not).
func stdinFrom(config []byte) error {
	fd, err := unix.MemfdCreate("nftmesh-cni-config", unix.MFD_CLOEXEC)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "nftmesh-cni-config")
	defer f.Close()
	if _, err := f.Write(config); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return syscall.Dup3(fd, 0, 0)
}

// standaloneEnv is the environment the standalone plugin runs with: the
// call's, plus GOMAXPROCS=1 unless it sets GOMAXPROCS. The plugin runs one
// goroutine at a time (its netlink work waits on the pod lookup, and
// nft.Backend.Prepare does its work inline with one P); a second P only
// has the runtime wake idle threads for the goroutines package
// initialisation and the HTTP client start, each one more thread, more
// scheduler work and page faults, which in a burst of ADDs (CPU-bound:
// all of them on the node's cores at once) are paid by every process. Set
// in the environment, it holds from the runtime's start, before any
// goroutine exists; set from the plugin's main it would come after them.
// docs/performance.md has the burst's figures (-3% to -8% CPU per ADD).
func standaloneEnv(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return env
		}
	}
	return append(env[:len(env):len(env)], "GOMAXPROCS=1")
}

// fail prints a CNI error on stdout and exits 1.
func fail(code int, msg string, err error) {
	b, _ := json.Marshal(struct {
		Code    int    `json:"code"`
		Msg     string `json:"msg"`
		Details string `json:"details,omitempty"`
	}{code, msg, err.Error()})
	os.Stdout.Write(b)
	os.Exit(1)
}
