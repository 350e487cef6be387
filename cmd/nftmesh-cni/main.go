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
// The front does little: it reads the config's agent_run_dir (encoding/json),
// and speaks the socket with a few system calls.
//
//go:debug updatemaxprocs=0
package main

import (
	"os"
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
	stdin, err := readAll(0)
	if err != nil {
		fail(5, "nftmesh-cni: reading the config from stdin", err.Error())
	}
	if reply, ok := ask(stdin, env); ok {
		if len(reply.Stdout) > 0 {
			writeAll(1, reply.Stdout)
		}
		if len(reply.Stderr) > 0 {
			writeAll(2, reply.Stderr)
		}
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
		if len(kv) > 4 && kv[:4] == "CNI_" {
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
	defer syscall.Close(fd)
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
	for n < len(frame) {
		m, err := syscall.SendmsgN(fd, frame[n:], nil, nil, syscall.MSG_NOSIGNAL)
		if err != nil {
			return none, false
		}
		n += m
	}
	var hdr [cnisock.HeaderLen]byte
	if !readFull(fd, hdr[:]) {
		return none, false
	}
	size, err := cnisock.BodyLen(hdr, cnisock.ReplyMagic)
	if err != nil {
		return none, false
	}
	body := make([]byte, size)
	if !readFull(fd, body) {
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
	self, err := os.Readlink("/proc/self/exe")
	if err != nil {
		fail(11, "nftmesh-cni: finding its own binary to run "+StandaloneName+" beside it", err.Error())
	}
	bin := self[:lastSlash(self)+1] + StandaloneName
	if stdin != nil {
		// A memory file with the config, as stdin: read by the plugin like
		// the runtime's pipe, whatever its size.
		mfd, err := memfd("nftmesh-cni-config")
		if err == nil {
			err = writeAll(mfd, stdin)
		}
		if err == nil {
			_, err = syscall.Seek(mfd, 0, 0)
		}
		if err == nil {
			err = syscall.Dup3(mfd, 0, 0)
		}
		if err != nil {
			fail(5, "nftmesh-cni: handing the config to "+StandaloneName, err.Error())
		}
		syscall.Close(mfd)
	}
	argv := append([]string{bin}, os.Args[1:]...)
	err = syscall.Exec(bin, argv, standaloneEnv(env))
	fail(11, "nftmesh-cni: cannot run "+bin+" (the nftmesh agent installs it beside nftmesh-cni; the pod is not started without its capture)", err.Error())
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
// Bursts of 100 ADDs as BenchmarkBurst's, half of them with and half
// without it, alternating ADD by ADD (the same conditions for both halves;
// load 11-90 on 2 cores, shared): CPU per ADD 81.9 vs 88.9, 88.5 vs 91.1
// and 75.9 vs 78.2 ms (-8%, -3%, -3%; two halves of one build differed by
// 3%), page faults per ADD 943 vs 1018 in every run.
func standaloneEnv(env []string) []string {
	for _, kv := range env {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return env
		}
	}
	return append(env[:len(env):len(env)], "GOMAXPROCS=1")
}

func lastSlash(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			return i
		}
	}
	return -1
}

// memfd creates an anonymous memory file (closed on exec; dup'ed onto
// stdin it is not).
func memfd(name string) (int, error) { return unix.MemfdCreate(name, unix.MFD_CLOEXEC) }

// fail prints a CNI error on stdout and exits 1.
func fail(code int, msg, details string) {
	b := []byte(`{"code":`)
	b = appendInt(b, code)
	b = append(b, `,"msg":`...)
	b = appendQuoted(b, msg)
	if details != "" {
		b = append(b, `,"details":`...)
		b = appendQuoted(b, details)
	}
	b = append(b, '}')
	writeAll(1, b)
	os.Exit(1)
}

func appendInt(b []byte, v int) []byte {
	if v >= 10 {
		b = appendInt(b, v/10)
	}
	return append(b, byte('0'+v%10))
}

// appendQuoted appends s as a JSON string.
func appendQuoted(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

func readAll(fd int) ([]byte, error) {
	b := make([]byte, 0, 16<<10)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := syscall.Read(fd, b[len(b):cap(b)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+n]
	}
}

func readFull(fd int, b []byte) bool {
	for len(b) > 0 {
		n, err := syscall.Read(fd, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return false
		}
		b = b[n:]
	}
	return true
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := syscall.Write(fd, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
