package installer

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/rs/zerolog"
)

// sameBytes reports whether both files exist with the same content.
func sameBytes(a, b string) bool {
	x, errA := os.ReadFile(a)
	y, errB := os.ReadFile(b)
	return errA == nil && errB == nil && bytes.Equal(x, y)
}

// binLog records, in the kernel's order, the appearance (a rename into
// place is a create) and the removal of our two binaries in the bin dirs.
// inotify keeps the order of the events of one instance, so this is the
// order in which the agent's renames and removals happened.
type binLog struct {
	mu   sync.Mutex
	seen []string // "create <path>" or "remove <path>"
}

func watchBinaries(t *testing.T, dirs ...string) *binLog {
	t.Helper()
	w, err := fsnotify.NewBufferedWatcher(1024)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if err := w.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	l := &binLog{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if b := filepath.Base(ev.Name); b != PluginName && b != StandaloneName {
					continue
				}
				var op string
				switch {
				case ev.Has(fsnotify.Create):
					op = "create "
				case ev.Has(fsnotify.Remove):
					op = "remove "
				default:
					continue
				}
				l.mu.Lock()
				l.seen = append(l.seen, op+ev.Name)
				l.mu.Unlock()
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				t.Errorf("watching the bin dirs (events lost, the order is unknown): %v", err)
			}
		}
	}()
	t.Cleanup(func() { w.Close(); <-done })
	return l
}

// next waits for n more events (they arrive shortly after the file
// operations), checks that no more come, and returns them.
func (l *binLog) next(t *testing.T, what string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		have := len(l.seen)
		l.mu.Unlock()
		if have >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// One more would be one too many: give it a moment to show.
	time.Sleep(50 * time.Millisecond)
	l.mu.Lock()
	got := l.seen
	l.seen = nil
	l.mu.Unlock()
	if len(got) != n {
		t.Fatalf("%s: the bin dirs saw %d events, want %d:\n\t%s", what, len(got), n, strings.Join(got, "\n\t"))
	}
	return got
}

// frontNeverAlone replays events over the files present before them and
// fails at the first moment a dir held the front without its companion:
// a front that runs then cannot find what it execs.
func frontNeverAlone(t *testing.T, what string, present map[string]bool, events []string) {
	t.Helper()
	for i, ev := range events {
		op, p, _ := strings.Cut(ev, " ")
		present[p] = op == "create"
		d := filepath.Dir(p)
		if present[filepath.Join(d, PluginName)] && !present[filepath.Join(d, StandaloneName)] {
			t.Fatalf("%s: after event %d the front was in %s without its companion:\n\t%s", what, i+1, d, strings.Join(events, "\n\t"))
		}
	}
}

// The front execs its companion from its own directory when the agent is
// not there: in every bin dir the companion must land before the front,
// on the first install and on a re-install alike, and leave after it.
func TestBinariesInstalledCompanionFirstRemovedLast(t *testing.T) {
	h := newHost(t)
	h.put(t, "10-calico.conflist", 0o644)
	cfg := h.config(t)
	events := watchBinaries(t, h.bin, h.bin2)
	a := startAgent(t, cfg)
	a.waitReady(t)
	h.assertInstalled(t, cfg)
	front, companion := filepath.Join(h.bin, PluginName), filepath.Join(h.bin, StandaloneName)
	front2, companion2 := filepath.Join(h.bin2, PluginName), filepath.Join(h.bin2, StandaloneName)
	present := map[string]bool{}
	got := events.next(t, "first install", 4)
	frontNeverAlone(t, "first install", present, got)
	if want := []string{"create " + companion, "create " + front, "create " + companion2, "create " + front2}; !slices.Equal(got, want) {
		t.Fatalf("first install: the bin dirs saw\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
	a.settle(t)

	// Both deleted (a node image wiping its bin dir; the front first, so
	// the test itself never leaves it alone): both come back, and the
	// front never without the companion, whichever way the agent's
	// reconciles interleave with the two deletes.
	for _, p := range []string{front, companion} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	a.waitFor(t, "both back", func() bool {
		return sameBytes(front, h.plugin) && sameBytes(companion, h.companion) && a.in.Ready() == nil
	})
	got = events.next(t, "re-install", 4)
	frontNeverAlone(t, "re-install", present, got)

	a.stop()
	if err := a.in.Cleanup(); err != nil {
		t.Fatal(err)
	}
	h.assertBinariesGone(t)
	got = events.next(t, "cleanup", 4)
	frontNeverAlone(t, "cleanup", present, got)
}

// Someone deletes or overwrites the companion: the watch puts the image's
// bytes back, and readiness names the companion while it is wrong.
func TestCompanionReplacedIsReinstalled(t *testing.T) {
	h := newHost(t)
	h.put(t, "10-kindnet.conflist", 0o644)
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	// The events of the install's own writes bring one more reconcile,
	// which would repair the overwrite below without the watch seeing it.
	a.settle(t)

	dst := filepath.Join(h.bin2, StandaloneName)
	if err := os.WriteFile(dst, []byte("tampered"), 0o755); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, "companion restored after an overwrite", func() bool { return sameBytes(dst, h.companion) && a.in.Ready() == nil })
	a.settle(t)

	dst = filepath.Join(h.bin, StandaloneName)
	if err := os.Remove(dst); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, "companion restored after a delete", func() bool { return sameBytes(dst, h.companion) && a.in.Ready() == nil })
	h.assertInstalled(t, cfg)

	// With no agent loop to put it back, readiness follows the live file.
	a.stop()
	if err := os.Remove(dst); err != nil {
		t.Fatal(err)
	}
	if err := a.in.Ready(); err == nil || !strings.Contains(err.Error(), StandaloneName) {
		t.Errorf("ready with the companion gone, or the error does not name it: %v", err)
	}
}

// An image without the companion next to the plugin binary cannot give a
// working front: the agent refuses to start and names the missing file.
func TestMissingCompanionIsConfigError(t *testing.T) {
	for name, spoil := range map[string]func(p string) error{
		"missing":   os.Remove,
		"empty":     func(p string) error { return os.WriteFile(p, nil, 0o755) },
		"directory": func(p string) error { return errors.Join(os.Remove(p), os.Mkdir(p, 0o755)) },
	} {
		t.Run(name, func(t *testing.T) {
			h := newHost(t)
			if err := spoil(h.companion); err != nil {
				t.Fatal(err)
			}
			_, err := New(h.config(t), zerolog.Nop(), nil)
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Flag != "plugin-binary" {
				t.Fatalf("want a ConfigError for --plugin-binary, got %v", err)
			}
			if !strings.Contains(err.Error(), h.companion) {
				t.Errorf("the error does not name %s: %v", h.companion, err)
			}
			h.assertBinariesGone(t)
		})
	}
}

// settle waits until the agent has gone 300ms without a reconcile.
func (a *agent) settle(t *testing.T) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-a.in.Reconciled:
		case <-time.After(300 * time.Millisecond):
			return
		case <-deadline:
			t.Fatal("the agent keeps reconciling")
		}
	}
}

// A front that cleanup cannot remove keeps its companion: left alone it
// would fail every pod the agent is not there for. The other bin dir is
// cleaned all the same.
func TestCleanupKeepsCompanionWhenFrontStays(t *testing.T) {
	h := newHost(t)
	h.put(t, "10-calico.conflist", 0o644)
	cfg := h.config(t)
	a := startAgent(t, cfg)
	a.waitReady(t)
	a.stop()
	// A front os.Remove cannot take away: a non-empty directory.
	front := filepath.Join(h.bin, PluginName)
	if err := os.Remove(front); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(front, "busy"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := a.in.Cleanup()
	if err == nil || !strings.Contains(err.Error(), "removing "+PluginName+" from "+h.bin) {
		t.Fatalf("want an error naming the front in %s, got %v", h.bin, err)
	}
	if !sameBytes(filepath.Join(h.bin, StandaloneName), h.companion) {
		t.Errorf("the companion went while its front stayed in %s", h.bin)
	}
	assertGone(t, filepath.Join(h.bin2, PluginName))
	assertGone(t, filepath.Join(h.bin2, StandaloneName))
}
