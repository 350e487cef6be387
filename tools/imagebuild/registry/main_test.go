package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// The registry serves on loopback what a push puts in it, and the
// referrers API unless told not to.
func TestServes(t *testing.T) {
	for name, args := range map[string][]string{
		"in memory": nil,
		// A --dir that does not exist yet is made.
		"on disk": {"--dir", filepath.Join(t.TempDir(), "blobs", "new")},
	} {
		t.Run(name, func(t *testing.T) { testServes(t, args) })
	}
}

func testServes(t *testing.T, args []string) {
	ready := make(chan string, 1)
	var stdout, stderr bytes.Buffer
	go run(append([]string{"--addr", "127.0.0.1:0"}, args...), &stdout, &stderr, ready)
	addr := <-ready
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.NewTag(addr + "/mesh/x:v1")
	if err := remote.Write(ref, img, remote.WithUserAgent("test")); err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustDigest(t, got), mustDigest(t, img); a != b {
		t.Errorf("pulled %s, pushed %s", a, b)
	}
	d, _ := name.NewDigest(addr + "/mesh/x@" + mustDigest(t, img))
	if _, err := remote.Referrers(d); err != nil {
		t.Errorf("referrers: %v", err)
	}
}

func mustDigest(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func TestRefusesAnAddressOffLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:5000", ":5000", "192.0.2.1:5000", "example.com:5000", "nonsense"} {
		var stdout, stderr bytes.Buffer
		if rc := run([]string{"--addr", addr}, &stdout, &stderr, nil); rc != 2 || !strings.Contains(stderr.String(), "want a loopback host:port") {
			t.Errorf("--addr %s: exit %d, %q", addr, rc, stderr.String())
		}
	}
}
