package installer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/installer/conflist"
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
				describe(want), describe(got), conflist.HasPlugin(p, got), got)
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
			want, err := conflist.InsertPlugin(p, last, ours)
			if err != nil {
				t.Fatal(err)
			}
			waitSettled(t, a, p, want)
			if err := conflist.VerifyInstalled(p, ours); err != nil {
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

// Cleanup runs while the primary rewrites its file: whatever the
// interleaving, the file ends as the primary's last write, never as an
// older version we recorded.
func TestCleanupDuringPrimaryBurst(t *testing.T) {
	h := newHost(t)
	p := filepath.Join(h.conf, "10-calico.conflist")
	if err := os.WriteFile(p, primaryVersion(t, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	a.stop()

	const writes = 200
	done := make(chan []byte)
	go func() {
		var last []byte
		for i := 1; i <= writes; i++ {
			last = primaryVersion(t, i)
			primaryWrite(t, p, last, i%2 == 0)
		}
		done <- last
	}()
	// The restore may or may not see the burst; either way it must not
	// write over a version newer than the one it read.
	err := a.in.Cleanup()
	last := <-done
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, last) {
		t.Errorf("after cleanup the file holds %s, want the primary's last write (%s)", describe(got), describe(last))
	}
}

// Someone moves our entry away from the end of the list: the plugin would
// then miss the primary's result (prevResult), so it goes back to last,
// and cleanup still restores the primary's own bytes.
func TestEntryMovedBackToLast(t *testing.T) {
	for _, pos := range []string{"first", "middle"} {
		t.Run(pos, func(t *testing.T) {
			h := newHost(t)
			p, orig := h.put(t, "10-calico.conflist", 0o644)
			cfg := h.config(t)
			a := startAgent(t, cfg)
			a.waitReady(t)
			ours := cfg.PluginConf().JSON()
			installed, _ := os.ReadFile(p)

			plugins, err := conflist.Plugins(installed)
			if err != nil {
				t.Fatal(err)
			}
			entry, rest := plugins[len(plugins)-1], plugins[:len(plugins)-1]
			var moved []json.RawMessage
			if pos == "first" {
				moved = append([]json.RawMessage{entry}, rest...)
			} else {
				moved = append(append(append(moved, rest[0]), entry), rest[1:]...)
			}
			b, err := conflist.WithPlugins(installed, moved)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			a.waitFor(t, "our entry back to last", func() bool {
				got, _ := os.ReadFile(p)
				return bytes.Equal(got, installed) && a.in.Ready() == nil
			})
			if err := conflist.VerifyInstalled(p, ours); err != nil {
				t.Fatal(err)
			}
			a.stop()
			if err := a.in.Cleanup(); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, orig) {
				t.Errorf("cleanup did not restore the primary's bytes:\n%s", got)
			}
		})
	}
}

// A config that is a symlink (some installers keep the real file
// elsewhere) stays a symlink: the agent writes through to the target, in
// the target's directory, follows the primary's rewrites there, and cleanup
// restores the target's bytes with the link in place.
func TestSymlinkedConflist(t *testing.T) {
	for _, relative := range []bool{false, true} {
		t.Run(fmt.Sprintf("relative=%v", relative), func(t *testing.T) {
			h := newHost(t)
			realDir := filepath.Join(h.root, "var/lib/primary")
			if err := os.MkdirAll(realDir, 0o755); err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(realDir, "10-calico.conflist")
			if err := os.WriteFile(target, primaryVersion(t, 0), 0o640); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(h.conf, "10-calico.conflist")
			dest := target
			if relative {
				var err error
				if dest, err = filepath.Rel(h.conf, target); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink(dest, link); err != nil {
				t.Fatal(err)
			}
			assertLink := func(when string) {
				t.Helper()
				if d, err := os.Readlink(link); err != nil || d != dest {
					t.Fatalf("%s: %s is no longer the symlink to %s (%q, %v)", when, link, dest, d, err)
				}
			}
			cfg := h.config(t)
			a := startAgent(t, cfg)
			a.waitReady(t)
			ours := cfg.PluginConf().JSON()
			assertLink("after install")
			if err := conflist.VerifyInstalled(target, ours); err != nil {
				t.Fatalf("the target does not hold our entry: %v", err)
			}
			if m := modeOf(t, target); m != 0o640 {
				t.Errorf("target mode %v, want the primary's 0640", m)
			}

			// The primary rewrites its real file, in place and by rename.
			var last []byte
			for i := 1; i <= 4; i++ {
				last = primaryVersion(t, i)
				primaryWrite(t, target, last, i%2 == 0)
				want, err := conflist.InsertPlugin(target, last, ours)
				if err != nil {
					t.Fatal(err)
				}
				a.waitFor(t, fmt.Sprintf("re-insert after write %d", i), func() bool {
					got, _ := os.ReadFile(target)
					return bytes.Equal(got, want)
				})
				assertLink(fmt.Sprintf("after write %d", i))
			}
			a.stop()
			if err := a.in.Cleanup(); err != nil {
				t.Fatal(err)
			}
			assertLink("after cleanup")
			if got, _ := os.ReadFile(target); !bytes.Equal(got, last) {
				t.Errorf("cleanup did not restore the target's bytes: it holds %s, want %s", describe(got), describe(last))
			}
			for _, d := range []string{h.conf, realDir} {
				entries, _ := os.ReadDir(d)
				if len(entries) != 1 {
					t.Errorf("%s holds %d entries after cleanup, want 1", d, len(entries))
				}
			}
		})
	}
}

// A single-plugin .conf that is a symlink becomes our .conflist (the
// runtime needs a list); the link is removed, never its target, and
// cleanup puts the link back.
func TestSymlinkedConfConverted(t *testing.T) {
	h := newHost(t)
	realDir := filepath.Join(h.root, "var/lib/primary")
	if err := os.MkdirAll(realDir, 0o755); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(filepath.Join(testConfDir, "10-bridge.conf"))
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(realDir, "bridge.conf")
	if err := os.WriteFile(target, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(h.conf, "10-bridge.conf")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	assertGone(t, link)
	if err := conflist.VerifyInstalled(filepath.Join(h.conf, "10-bridge.conflist"), cfg.PluginConf().JSON()); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(target); !bytes.Equal(got, orig) {
		t.Error("the link's target was modified")
	}
	a.stop()
	if err := a.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if d, err := os.Readlink(link); err != nil || d != target {
		t.Errorf("the link was not restored (%q, %v)", d, err)
	}
	assertGone(t, filepath.Join(h.conf, "10-bridge.conflist"))
	if got, _ := os.ReadFile(target); !bytes.Equal(got, orig) {
		t.Error("the link's target was modified")
	}
}

// A FIFO planted under the config's name must not hang cleanup (opening
// one for reading blocks until a writer comes).
func TestCleanupDoesNotHangOnFIFO(t *testing.T) {
	h := newHost(t)
	p, _ := h.put(t, "10-calico.conflist", 0o644)
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	a.stop()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.in.Cleanup() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("want an error naming %s, got %v", p, err)
		}
	case <-time.After(10 * time.Second):
		// Unblock the stuck open so the test binary can finish.
		if f, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		t.Fatal("cleanup hangs on a FIFO in place of the config")
	}
}
