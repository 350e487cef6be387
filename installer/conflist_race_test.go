package installer

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// primaryVersion is the primary CNI's config as its n-th write makes it:
// a real conflist whose bytes differ from every other version's.
func primaryVersion(t *testing.T, n int) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testConfDir, "10-calico.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), `"mtu": 0,`, fmt.Sprintf(`"mtu": %d,`, 1400+n), 1)
	if s == string(b) {
		t.Fatal("version marker did not apply")
	}
	return []byte(s)
}

// primaryWrite writes b the way a primary CNI's installer does: in place
// (open with O_TRUNC, write) or as a new file renamed over the old one.
func primaryWrite(t *testing.T, p string, b []byte, inPlace bool) {
	t.Helper()
	if inPlace {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Error(err)
		}
		return
	}
	tmp := filepath.Join(filepath.Dir(p), ".primary-tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Error(err)
		return
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Error(err)
	}
}

// waitSettled waits until the file holds want and has stayed so for a
// while (the agent has nothing left to do), failing with what it holds.
func waitSettled(t *testing.T, a *agent, p string, want []byte) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var stable time.Time
	for {
		got, _ := os.ReadFile(p)
		switch {
		case !bytes.Equal(got, want):
			stable = time.Time{}
		case stable.IsZero():
			stable = time.Now()
		case time.Since(stable) > 500*time.Millisecond && a.in.Ready() == nil:
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the file did not settle on the primary's last write (%s) plus our entry; it holds %s (our entry: %v):\n%s",
				describe(want), describe(got), HasPlugin(p, got), got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The primary CNI rewrites its config in bursts while the real agent loop
// runs with its default throttle. Whatever the interleaving, the agent must
// end with the primary's LAST write plus exactly one entry of ours, last,
// and SIGTERM must restore that last write byte for byte.
func TestPrimaryBurstKeepsLastWrite(t *testing.T) {
	for _, tc := range []struct {
		name    string
		writes  int
		gap     func() time.Duration
		inPlace func(i int) bool
	}{
		{"in-place/12-spaced", 12, spaced, always(true)},
		{"rename/12-spaced", 12, spaced, always(false)},
		{"in-place/200-back-to-back", 200, noGap, always(true)},
		{"rename/200-back-to-back", 200, noGap, always(false)},
		{"mixed/200-back-to-back", 200, noGap, func(i int) bool { return i%3 == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			p := filepath.Join(h.conf, "10-calico.conflist")
			if err := os.WriteFile(p, primaryVersion(t, 0), 0o644); err != nil {
				t.Fatal(err)
			}
			// The agent's default rate limit, as in production: the bug
			// needs the wait between read and write.
			cfg := h.config(t, "--reinstall-rate", "1", "--reinstall-burst", "5")
			a := startAgent(t, cfg)
			a.waitReady(t)
			ours := cfg.PluginConf().JSON()

			var last []byte
			for i := 1; i <= tc.writes; i++ {
				last = primaryVersion(t, i)
				primaryWrite(t, p, last, tc.inPlace(i))
				if d := tc.gap(); d > 0 {
					time.Sleep(d)
				}
			}
			want, err := InsertPlugin(p, last, ours)
			if err != nil {
				t.Fatal(err)
			}
			waitSettled(t, a, p, want)
			if err := VerifyInstalled(p, ours); err != nil {
				t.Fatal(err)
			}

			a.stop()
			if err := a.in.Cleanup(); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, last) {
				t.Errorf("cleanup did not restore the primary's last write (%s), the file holds %s:\n%s", describe(last), describe(got), got)
			}
		})
	}
}

func spaced() time.Duration {
	return 50*time.Millisecond + rand.N(250*time.Millisecond)
}

func noGap() time.Duration { return 0 }

func always(v bool) func(int) bool { return func(int) bool { return v } }

var versionRE = regexp.MustCompile(`"mtu": (\d+)`)

// describe names the primary version a file's content is.
func describe(b []byte) string {
	m := versionRE.FindSubmatch(b)
	if m == nil {
		return fmt.Sprintf("no version (%d bytes)", len(b))
	}
	n, _ := strconv.Atoi(string(m[1]))
	return fmt.Sprintf("write %d", n-1400)
}
