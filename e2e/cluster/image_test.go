package cluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"
)

// imageFile is one file of an image layer.
type imageFile struct {
	Path string // absolute, inside the image
	Src  string // file on the machine
	Mode int64
}

// writeDockerArchive writes a one-layer image as a docker-archive tarball,
// the format `ctr images import` reads. It is the test's own stand-in for
// images it needs but the project does not ship (the pod sandbox).
func writeDockerArchive(out, tag string, files []imageFile, entrypoint []string) error {
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := filepath.Dir(f.Path); d != "/" && !dirs[d]; d = filepath.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Name: d[1:] + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}); err != nil {
				return fmt.Errorf("writing layer of %s: %w", tag, err)
			}
		}
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return fmt.Errorf("reading %s for image %s: %w", f.Src, tag, err)
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.Path[1:], Typeflag: tar.TypeReg, Mode: f.Mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return fmt.Errorf("writing layer of %s: %w", tag, err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("writing layer of %s: %w", tag, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("writing layer of %s: %w", tag, err)
	}
	layerSum := sha256.Sum256(layer.Bytes())
	layerID := hex.EncodeToString(layerSum[:])

	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config":       map[string]any{"Entrypoint": entrypoint, "User": "0:0"},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerID}},
	})
	if err != nil {
		return fmt.Errorf("encoding config of %s: %w", tag, err)
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{tag},
		"Layers":   []string{layerID + ".tar"},
	}})
	if err != nil {
		return fmt.Errorf("encoding manifest of %s: %w", tag, err)
	}

	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("creating image archive %s: %w", out, err)
	}
	defer f.Close()
	aw := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		data []byte
	}{{configName, config}, {layerID + ".tar", layer.Bytes()}, {"manifest.json", manifest}} {
		if err := aw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch}); err != nil {
			return fmt.Errorf("writing image archive %s: %w", out, err)
		}
		if _, err := aw.Write(e.data); err != nil {
			return fmt.Errorf("writing image archive %s: %w", out, err)
		}
	}
	if err := aw.Close(); err != nil {
		return fmt.Errorf("writing image archive %s: %w", out, err)
	}
	return f.Close()
}

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

// buildImages builds the pause image and, until `make image` provides it,
// the nftmesh image from the working tree; it returns the archives to
// import.
func buildImages(repo, dir string) ([]string, error) {
	if err := os.MkdirAll(filepath.Join(dir, "images", "bin"), 0o755); err != nil {
		return nil, fmt.Errorf("creating image directory: %w", err)
	}
	bin := func(name string) string { return filepath.Join(dir, "images", "bin", name) }
	for pkg, name := range map[string]string{
		"./e2e/cluster/pause": "pause",
		"./cmd/nftmesh-agent": "nftmesh-agent",
		"./cmd/nftmesh-cni":   "nftmesh-cni",
		"./cmd/redirect":      "redirect",
	} {
		if err := goBuild(repo, pkg, bin(name)); err != nil {
			return nil, err
		}
	}
	pause := filepath.Join(dir, "images", "pause.tar")
	if err := writeDockerArchive(pause, pauseImage, []imageFile{{Path: "/pause", Src: bin("pause"), Mode: 0o755}}, []string{"/pause"}); err != nil {
		return nil, err
	}
	nftmesh := filepath.Join(dir, "images", "nftmesh.tar")
	if err := writeDockerArchive(nftmesh, nftmeshImage, []imageFile{
		{Path: "/usr/local/bin/nftmesh-agent", Src: bin("nftmesh-agent"), Mode: 0o755},
		{Path: "/usr/local/bin/redirect", Src: bin("redirect"), Mode: 0o755},
		{Path: "/opt/cni/bin/nftmesh-cni", Src: bin("nftmesh-cni"), Mode: 0o755},
	}, []string{"/usr/local/bin/nftmesh-agent"}); err != nil {
		return nil, err
	}
	return []string{pause, nftmesh}, nil
}
