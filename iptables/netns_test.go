package iptables

import (
	"regexp"
	"strings"
	"testing"

	"github.com/nftmesh/nftmesh/testkit/nstest"
)

var saveComment = regexp.MustCompile(`(?m)^# (Generated|Completed) .*\n`)

// saveTables runs iptables-legacy-save (or ip6tables-legacy-save) in ns and
// strips the dated comment lines.
func saveTables(t testing.TB, ns string, v6 bool) string {
	t.Helper()
	bin := "iptables-legacy-save"
	if v6 {
		bin = "ip6tables-legacy-save"
	}
	return saveComment.ReplaceAllString(nstest.Run(t, ns, "", bin), "")
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
