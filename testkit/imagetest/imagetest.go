// Package imagetest makes and reads the test kit's one-layer images as
// docker-archive tarballs (what `ctr images import` takes): the pod
// sandbox, the injected pods' stand-ins, and the cluster test's look into
// the nftmesh image it installed. The image library lives in the image
// tooling's own module (tools/imagebuild), which this module does not
// link: these helpers run its fileimage command with `go -C
// tools/imagebuild run ./fileimage` (Go caches the built command).
package imagetest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
)

// File is one file of an image: Src on the host goes to Path in the image,
// as a regular file with mode 0755.
type File struct{ Path, Src string }

// Spec is a one-layer image of files on an empty base.
type Spec struct {
	Tag        string // repository:tag, the name the archive carries
	Files      []File
	Entrypoint []string
	User       string // uid:gid
	Labels     map[string]string
}

// Image is what an archive's only image holds.
type Image struct {
	OS           string            `json:"os"`
	Architecture string            `json:"architecture"`
	Entrypoint   []string          `json:"entrypoint"`
	User         string            `json:"user"`
	Labels       map[string]string `json:"labels"`
	// Files are the regular files by absolute path.
	Files map[string]FileInfo `json:"files"`
}

// FileInfo is one regular file of an image.
type FileInfo struct {
	Mode   uint32 `json:"mode"` // permission bits
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // hex
}

// toolDir is the image tooling's module.
func toolDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "tools", "imagebuild")
}

func fileimage(args ...string) ([]byte, error) {
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.Command(goBin, append([]string{"-C", toolDir(), "run", "./fileimage"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("running tools/imagebuild's fileimage %s: %w: %s", args[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// Write builds s as a docker-archive tarball at out.
func Write(out string, s Spec) error {
	args := []string{"build", "--out", out, "--tag", s.Tag}
	for _, e := range s.Entrypoint {
		args = append(args, "--entrypoint", e)
	}
	if s.User != "" {
		args = append(args, "--user", s.User)
	}
	keys := make([]string, 0, len(s.Labels))
	for k := range s.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "--label", k+"="+s.Labels[k])
	}
	for _, f := range s.Files {
		args = append(args, "--file", f.Path+"="+f.Src)
	}
	_, err := fileimage(args...)
	return err
}

// Read returns the config and the files of the archive's only image.
func Read(archive string) (*Image, error) {
	out, err := fileimage("show", "--archive", archive)
	if err != nil {
		return nil, err
	}
	var img Image
	if err := json.Unmarshal(out, &img); err != nil {
		return nil, fmt.Errorf("reading fileimage show's output for %s: %w", archive, err)
	}
	return &img, nil
}

// ReadFile returns the content of the regular file at path in the
// archive's only image.
func ReadFile(archive, path string) ([]byte, error) {
	tmp, err := os.CreateTemp("", "imagetest-*")
	if err != nil {
		return nil, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if _, err := fileimage("cat", "--archive", archive, "--path", path, "--out", tmp.Name()); err != nil {
		return nil, err
	}
	return os.ReadFile(tmp.Name())
}

// ReadRemoteFile returns the content of the regular file at path in the
// image ref names in its registry (plain HTTP on 127.0.0.1 or localhost);
// for an index, its image for platform ("linux/amd64").
func ReadRemoteFile(ref, platform, path string) ([]byte, error) {
	tmp, err := os.CreateTemp("", "imagetest-*")
	if err != nil {
		return nil, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if _, err := fileimage("cat", "--ref", ref, "--platform", platform, "--path", path, "--out", tmp.Name()); err != nil {
		return nil, err
	}
	return os.ReadFile(tmp.Name())
}

// RemoteDigest is the digest (sha256:...) of what ref names in its
// registry.
func RemoteDigest(ref string) (string, error) {
	out, err := fileimage("digest", "--ref", ref)
	return string(bytes.TrimSpace(out)), err
}
