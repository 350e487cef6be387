package release

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// copyCheckout copies this checkout's files as they are on disk (tracked
// and untracked, not ignored: what the next commit would hold) into a new
// git repository on branch main with one commit, so that make release can
// commit and tag there. git's user configuration is kept out.
func copyCheckout(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: builds the binaries twice")
	}
	for _, tool := range []string{"git", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	helm(t)
	src, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	// Listed with the caller's git configuration (safe.directory when root
	// runs the tests in another user's checkout, as CI does).
	list := run(t, src, nil, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	t.Setenv("GIT_CONFIG_GLOBAL", os.DevNull)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	for k, v := range map[string]string{"GIT_AUTHOR_NAME": "release test", "GIT_AUTHOR_EMAIL": "release@example.com",
		"GIT_COMMITTER_NAME": "release test", "GIT_COMMITTER_EMAIL": "release@example.com"} {
		t.Setenv(k, v)
	}
	// Nothing of the caller's make (`make test VERSION=...` reaches us in
	// MAKEFLAGS) or of its variables in the environment may reach the
	// copy's: it computes its own.
	for _, k := range []string{"MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL", "VERSION", "CHART_VERSION", "REVISION", "REGISTRY", "IMAGE", "IMAGE_REPO", "BIN"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	for _, f := range strings.Split(strings.TrimRight(list, "\x00"), "\x00") {
		copyFile(t, filepath.Join(src, f), filepath.Join(dst, f))
	}
	run(t, dst, nil, "git", "init", "-q", "-b", "main")
	run(t, dst, nil, "git", "add", "-A")
	run(t, dst, nil, "git", "commit", "-q", "-m", "the checkout under test")
	return dst
}

// copyFile copies one file with its mode; a path listed but gone (deleted,
// not yet committed) is left out, as the next commit would.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	fi, err := os.Lstat(src)
	if os.IsNotExist(err) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err == nil {
			err = os.Symlink(target, dst)
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := os.ReadFile(src)
	if err == nil {
		err = os.WriteFile(dst, data, fi.Mode().Perm())
	}
	if err != nil {
		t.Fatal(err)
	}
}

// run runs a command in dir and returns its output (stdout and stderr),
// failing the test when it fails. env, when not nil, is the whole
// environment but PATH and HOME.
func run(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s (in %s): %v\n%s", strings.Join(args, " "), dir, err, out.String())
	}
	return strings.TrimRight(out.String(), "\n")
}

// makeVar is what a printing target of the Makefile says.
func makeVar(t *testing.T, dir, target string, vars ...string) string {
	t.Helper()
	return run(t, dir, nil, append([]string{"make", "-s", "--no-print-directory", target}, vars...)...)
}

type chartMeta struct {
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

func chartYAML(t *testing.T, dir string) chartMeta {
	t.Helper()
	var c chartMeta
	if err := yaml.Unmarshal([]byte(readFile(t, dir, "charts/nftmesh/Chart.yaml")), &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func readFile(t *testing.T, dir, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// helm finds helm as the Makefile names it ($HELM_BIN), on PATH, or in
// $(go env GOPATH)/bin; without it the test is skipped, or fails under CI=true.
func helm(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv("HELM_BIN")}
	if p, err := exec.LookPath("helm"); err == nil {
		candidates = append(candidates, p)
	}
	if gopath, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		candidates = append(candidates, filepath.Join(strings.TrimSpace(string(gopath)), "bin", "helm"))
	}
	for _, p := range candidates {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true and helm is not installed (make helm)")
	}
	t.Skip("helm is not installed (make helm)")
	return ""
}
