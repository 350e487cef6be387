package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// git runs git in the repository and returns its trimmed standard output;
// the error carries what git said.
func git(repo string, args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", repo}, args...)...)
	// No optional index lock: a make running beside us may read the tree.
	cmd.Env = append(os.Environ(), "GIT_OPTIONAL_LOCKS=0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	// Only the end: porcelain status lines begin with a space.
	return strings.TrimRight(stdout.String(), " \t\n"), nil
}

// releaseTags returns the repository's tags that look like releases (v*).
func releaseTags(repo string) ([]string, error) {
	out, err := git(repo, "tag", "--list", "v*")
	if err != nil || out == "" {
		return nil, err
	}
	return strings.Split(out, "\n"), nil
}

// clean refuses a working tree with changed or untracked files: a release
// is exactly a commit.
func clean(repo, v string) error {
	out, err := git(repo, "status", "--porcelain")
	if err != nil {
		return err
	}
	if out != "" {
		paths := strings.Split(out, "\n")
		return fmt.Errorf("the working tree has %d changed or untracked path(s), first %s: commit or remove them before releasing %s", len(paths), shown(paths[0]), v)
	}
	if _, err := git(repo, "symbolic-ref", "-q", "HEAD"); err != nil {
		return fmt.Errorf("HEAD is not on a branch: check out the branch %s is released from", v)
	}
	return nil
}

// commit commits the given paths, as they are in the working tree, and
// returns the new commit's short hash.
func commit(repo, msg string, paths ...string) (string, error) {
	if _, err := git(repo, append([]string{"commit", "-q", "-m", msg, "--"}, paths...)...); err != nil {
		return "", err
	}
	return git(repo, "rev-parse", "--short", "HEAD")
}
