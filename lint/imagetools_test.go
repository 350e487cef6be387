package lint

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// imageTooling is what only builds, pushes, signs and describes the image:
// the image tooling's module (tools/imagebuild) and the libraries it alone
// needs (what they pull in, docker/cli and the like, goes with them). The
// product module links none of them, tests included, and its go.mod
// requires none: they are the tooling's go.mod's. A test that needs an
// image or a registry runs the tooling's commands (testkit/imagetest,
// `go -C tools/imagebuild run ./registry`).
var imageTooling = []string{
	module + "/tools/",
	"github.com/google/go-containerregistry",
	"github.com/sigstore/",
	"github.com/spdx/",
}

// imageModule is the image tooling's module, next to the product's.
const (
	imageModule    = module + "/tools/imagebuild"
	imageModuleDir = "../tools/imagebuild"
)

func isImageTooling(path string) bool {
	for _, p := range imageTooling {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

// goOutput runs go with args in dir.
func goOutput(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return out
}

// requires are the module paths a go.mod requires and replaces.
func requires(t *testing.T, dir string) []string {
	t.Helper()
	var mod struct {
		Require []struct{ Path string }
		Replace []struct{ Old, New struct{ Path string } }
	}
	if err := json.Unmarshal(goOutput(t, dir, "mod", "edit", "-json"), &mod); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range mod.Require {
		out = append(out, r.Path)
	}
	for _, r := range mod.Replace {
		out = append(out, r.Old.Path, r.New.Path)
	}
	return out
}

// TestImageToolingIsItsOwnModule (rules image-tooling-*): the image is
// built, pushed, signed and described by a module of its own, and the
// two modules stay apart both ways.
func TestImageToolingIsItsOwnModule(t *testing.T) {
	t.Run("image-tooling-not-linked", func(t *testing.T) {
		// Every package of the product module with its tests' imports.
		for _, p := range strings.Fields(string(goOutput(t, "..", "list", "-deps", "-test", "./..."))) {
			if isImageTooling(p) {
				t.Errorf("rule image-tooling-not-linked (no binary, test or test kit of the product module links the image tooling or its libraries; testkit/imagetest runs its commands): %s is linked", p)
			}
		}
	})
	t.Run("image-tooling-not-required", func(t *testing.T) {
		for _, r := range requires(t, "..") {
			if isImageTooling(r) {
				t.Errorf("rule image-tooling-not-required (the product's go.mod carries only what its binaries and tests link): go.mod requires %s", r)
			}
		}
	})
	t.Run("image-module-links-no-product", func(t *testing.T) {
		// The tooling reads the product's binaries as files; it links
		// nothing of the product module, so no replace ties the two.
		for _, r := range requires(t, imageModuleDir) {
			if r == module || strings.HasPrefix(r, "./") || strings.HasPrefix(r, "../") {
				t.Errorf("rule image-module-links-no-product: tools/imagebuild/go.mod requires or replaces %s", r)
			}
		}
		for _, p := range strings.Fields(string(goOutput(t, imageModuleDir, "list", "-deps", "-test", "./..."))) {
			if strings.HasPrefix(p, module+"/") && !strings.HasPrefix(p, imageModule) { // imagebuild.test too
				t.Errorf("rule image-module-links-no-product: tools/imagebuild links %s", p)
			}
		}
	})
	t.Run("internal-is-linked", func(t *testing.T) {
		// internal/ holds what the binaries link, nothing only a build
		// step or a test uses.
		linked := map[string]bool{}
		for _, p := range strings.Fields(string(goOutput(t, "..", "list", "-deps", "./cmd/..."))) {
			linked[p] = true
		}
		for _, p := range strings.Fields(string(goOutput(t, "..", "list", "./internal/..."))) {
			if !linked[p] {
				t.Errorf("rule internal-is-linked (internal/ holds only what the binaries link): no binary under cmd/ links %s", p)
			}
		}
	})
}
