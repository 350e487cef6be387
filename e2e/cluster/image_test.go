package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/nftmesh/nftmesh/internal/imagebuild"
)

// goBuild builds a static binary of one of the repository's packages.
func goBuild(repo, pkg, out string) error {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", pkg, err, out)
	}
	return nil
}

// buildImages builds the pause image (the pod sandbox, not reachable
// offline) and the nftmesh image from the working tree, and returns the
// docker-archive tarballs to import.
func buildImages(repo, dir string) ([]string, error) {
	binDir := filepath.Join(dir, "images", "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating image directory: %w", err)
	}
	bins := map[string][]byte{}
	for name, pkg := range map[string]string{
		"pause":         "./e2e/cluster/standin/cmd/pause",
		"nftmesh-agent": "./cmd/nftmesh-agent",
		"nftmesh-cni":   "./cmd/nftmesh-cni",
		"redirect":      "./cmd/redirect",
	} {
		out := filepath.Join(binDir, name)
		if err := goBuild(repo, pkg, out); err != nil {
			return nil, err
		}
		data, err := os.ReadFile(out)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", out, err)
		}
		bins[name] = data
	}

	pause, err := imagebuild.Build([]imagebuild.File{{Path: "/pause", Mode: 0o755, Data: bins["pause"]}},
		imagebuild.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"})
	if err != nil {
		return nil, fmt.Errorf("building the pause image: %w", err)
	}
	pauseTar := filepath.Join(dir, "images", "pause.tar")
	if err := imagebuild.WriteDockerArchive(pauseTar, pauseImage, pause); err != nil {
		return nil, err
	}

	nftmesh, err := imagebuild.Nftmesh(imagebuild.Binaries{
		Agent: bins["nftmesh-agent"], Plugin: bins["nftmesh-cni"], Redirect: bins["redirect"],
	}, imagebuild.Meta{Version: nftmeshTag})
	if err != nil {
		return nil, err
	}
	nftmeshTar := filepath.Join(dir, "images", "nftmesh.tar")
	if err := imagebuild.WriteDockerArchive(nftmeshTar, nftmeshImage, nftmesh); err != nil {
		return nil, err
	}
	return []string{pauseTar, nftmeshTar}, nil
}
