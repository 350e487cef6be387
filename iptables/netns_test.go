package iptables

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
)

var nsCounter atomic.Int64

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root (CAP_NET_ADMIN and netns creation); run as root")
	}
}

// newNetns creates a fresh named netns "leg-<pid>-<n>" removed on cleanup,
// and returns its path.
func newNetns(t testing.TB) (name, path string) {
	t.Helper()
	needRoot(t)
	name = fmt.Sprintf("leg-%d-%d", os.Getpid(), nsCounter.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	// A pod's lo is up (the CNI loopback plugin does it); routes on lo need it.
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return name, "/run/netns/" + name
}

// inNetns runs a test-only binary in the named netns.
func inNetns(t testing.TB, ns, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in %s: %v: %s", strings.Join(args, " "), ns, err, out)
	}
	return string(out)
}

var saveComment = regexp.MustCompile(`(?m)^# (Generated|Completed) .*\n`)

// saveTables runs iptables-legacy-save (or ip6tables-legacy-save) in ns and
// strips the dated comment lines.
func saveTables(t testing.TB, ns string, v6 bool) string {
	t.Helper()
	bin := "iptables-legacy-save"
	if v6 {
		bin = "ip6tables-legacy-save"
	}
	return saveComment.ReplaceAllString(inNetns(t, ns, "", bin), "")
}

func restoreBin(v6 bool) string {
	if v6 {
		return "ip6tables-legacy-restore"
	}
	return "iptables-legacy-restore"
}

// splitTables cuts iptables-save text into table name → block.
func splitTables(s string) map[string]string {
	out := map[string]string{}
	var name string
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if strings.HasPrefix(line, "*") {
			name = strings.TrimSpace(line[1:])
			b.Reset()
		}
		b.WriteString(line)
		if strings.TrimSpace(line) == "COMMIT" {
			out[name] = b.String()
		}
	}
	return out
}
