package cluster

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/nftmesh/nftmesh/testkit/imagetest"
)

// goBuild builds a static binary of one of the repository's packages.
func goBuild(repo, pkg, out string) error {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	// The version is the fallback image's tag, so the installed plugin's
	// --version matches the image as it does after `make image`.
	_, version, _ := strings.Cut(nftmeshImage, ":")
	cmd := exec.Command(goBin, "build", "-trimpath",
		"-ldflags=-s -w -X github.com/nftmesh/nftmesh/internal/version.Version="+version, "-o", out, pkg)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", pkg, err, out)
	}
	return nil
}

// nftmeshImage is the image the chart runs: `make image`'s IMAGE when the
// Makefile passes NFTMESH_IMAGE_TAR and NFTMESH_IMAGE, else one built here
// from the working tree with the same library.
var nftmeshImage = "localhost/nftmesh:e2e-dev"

// buildImages builds the pause image (the pod sandbox: Kubernetes' own is
// not reachable offline) and, unless `make image` built it, the nftmesh
// image, and returns the docker-archive tarballs to import.
func buildImages(repo, dir string) ([]string, error) {
	binDir := filepath.Join(dir, "images", "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating image directory: %w", err)
	}
	build := func(name, pkg string) (string, error) {
		out := filepath.Join(binDir, name)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return "", err
		}
		return out, goBuild(repo, pkg, out)
	}
	pauseBin, err := build("pause", "./e2e/cluster/standin/cmd/pause")
	if err != nil {
		return nil, err
	}
	pauseTar := filepath.Join(dir, "images", "pause.tar")
	err = imagetest.Write(pauseTar, imagetest.Spec{Tag: pauseImage, Files: []imagetest.File{{Path: "/pause", Src: pauseBin}},
		Entrypoint: []string{"/pause"}, User: "65535:65535"})
	if err != nil {
		return nil, fmt.Errorf("building the pause image: %w", err)
	}

	if tar := os.Getenv("NFTMESH_IMAGE_TAR"); tar != "" {
		ref := os.Getenv("NFTMESH_IMAGE")
		if ref == "" {
			return nil, fmt.Errorf("NFTMESH_IMAGE_TAR=%s is set but NFTMESH_IMAGE (its tag) is not", tar)
		}
		// A copy: TestReadmeInstall's `make push` writes bin/ again
		// (under another tag when the tree changed meanwhile), and nodes
		// joining later import the archive then.
		own := filepath.Join(dir, "images", "nftmesh.tar")
		if err := copyFile(tar, own); err != nil {
			return nil, fmt.Errorf("the nftmesh image (make image): %w", err)
		}
		nftmeshImage = ref
		return []string{pauseTar, own}, nil
	}
	// Where mkimage looks for the binaries of the host's architecture.
	for _, pkg := range []string{"./cmd/nftmesh-agent", "./cmd/nftmesh-cni", "./cmd/nftmesh-cni-standalone", "./cmd/redirect"} {
		if _, err := build(filepath.Join("linux-"+runtime.GOARCH, filepath.Base(pkg)), pkg); err != nil {
			return nil, err
		}
	}
	// The image tooling's own command, as `make image` runs it.
	_, version, _ := strings.Cut(nftmeshImage, ":")
	nftmeshTar := filepath.Join(dir, "images", "nftmesh.tar")
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "-C", filepath.Join(repo, "tools", "imagebuild"), "run", "./mkimage",
		"--bin-dir", binDir, "--arch", runtime.GOARCH, "--version", version, "--tag", nftmeshImage, "--out", nftmeshTar)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the nftmesh image: %w\n%s", err, out)
	}
	return []string{pauseTar, nftmeshTar}, nil
}

// fileInImage returns a file's content from a docker-archive's only image.
func fileInImage(archive, path string) ([]byte, error) {
	return imagetest.ReadFile(archive, path)
}

// copyFile copies src to a new file dst.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	return out.Close()
}
