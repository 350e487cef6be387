package cluster

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/nftmesh/nftmesh/internal/imagebuild"
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
	build := func(name, pkg string) ([]byte, error) {
		out := filepath.Join(binDir, name)
		if err := goBuild(repo, pkg, out); err != nil {
			return nil, err
		}
		data, err := os.ReadFile(out)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", out, err)
		}
		return data, nil
	}
	pauseBin, err := build("pause", "./e2e/cluster/standin/cmd/pause")
	if err != nil {
		return nil, err
	}
	pause, err := imagebuild.Build([]imagebuild.File{{Path: "/pause", Mode: 0o755, Data: pauseBin}},
		imagebuild.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"})
	if err != nil {
		return nil, fmt.Errorf("building the pause image: %w", err)
	}
	pauseTar := filepath.Join(dir, "images", "pause.tar")
	if err := imagebuild.WriteDockerArchive(pauseTar, pauseImage, pause); err != nil {
		return nil, err
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
	bins := map[string][]byte{}
	for name, pkg := range map[string]string{
		"nftmesh-agent":          "./cmd/nftmesh-agent",
		"nftmesh-cni":            "./cmd/nftmesh-cni",
		"nftmesh-cni-standalone": "./cmd/nftmesh-cni-standalone",
		"redirect":               "./cmd/redirect",
	} {
		if bins[name], err = build(name, pkg); err != nil {
			return nil, err
		}
	}
	_, version, _ := strings.Cut(nftmeshImage, ":")
	nftmesh, err := imagebuild.Nftmesh(imagebuild.Binaries{
		Agent: bins["nftmesh-agent"], Plugin: bins["nftmesh-cni"], Standalone: bins["nftmesh-cni-standalone"], Redirect: bins["redirect"],
	}, imagebuild.Meta{Version: version})
	if err != nil {
		return nil, err
	}
	nftmeshTar := filepath.Join(dir, "images", "nftmesh.tar")
	if err := imagebuild.WriteDockerArchive(nftmeshTar, nftmeshImage, nftmesh); err != nil {
		return nil, err
	}
	return []string{pauseTar, nftmeshTar}, nil
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

// fileInImage returns a file's content from a docker-archive's only image.
func fileInImage(archive, path string) ([]byte, error) {
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		return nil, fmt.Errorf("reading image %s: %w", archive, err)
	}
	return fileInV1Image(img, archive, path)
}

// fileInV1Image returns a file's content from an image (what names it in
// errors).
func fileInV1Image(img v1.Image, what, path string) ([]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("reading layers of %s: %w", what, err)
	}
	want := strings.TrimPrefix(path, "/")
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, fmt.Errorf("reading a layer of %s: %w", what, err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if strings.TrimPrefix(h.Name, "./") == want {
				data, err := io.ReadAll(tr)
				rc.Close()
				return data, err
			}
		}
		rc.Close()
	}
	return nil, fmt.Errorf("%s not in image %s", path, what)
}
