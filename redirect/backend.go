package redirect

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Backend programs a Plan into a network namespace, given as the path of its
// file (/var/run/netns/x, /proc/PID/ns/net). A new capture feature changes
// the model and the renderers, never this interface.
type Backend interface {
	// Name is the backend's name as used in flags and logs.
	Name() string
	// Apply installs p atomically, replacing whatever this backend installed
	// before. On error nothing of p is left behind.
	Apply(ctx context.Context, netns string, p Plan) error
	// List reads back what this backend has installed, in Plan form.
	// Nothing installed gives an empty Plan and no error.
	List(ctx context.Context, netns string) (Plan, error)
	// Check compares the live state with p; it returns a *DriftError listing
	// the differences, or nil when they are equal.
	Check(ctx context.Context, netns string, p Plan) error
	// Remove deletes everything this backend installed. Nothing installed
	// is success.
	Remove(ctx context.Context, netns string) error
}

// Backend names, as flags, the plugin config, the chart and logs spell them.
const (
	// BackendAuto lets the pipeline choose per network namespace.
	BackendAuto     = "auto"
	BackendNFTables = "nftables"
	BackendLegacy   = "iptables-legacy"
)

// DriftError reports differences between a Plan and a live namespace.
// Each line starts with "-" (expected, missing) or "+" (present, unexpected).
type DriftError struct{ Lines []string }

func (e *DriftError) Error() string {
	return fmt.Sprintf("live rules differ from the plan (%d lines):\n%s", len(e.Lines), strings.Join(e.Lines, "\n"))
}

// IsDrift reports whether err is (or wraps) a *DriftError.
func IsDrift(err error) bool {
	var d *DriftError
	return errors.As(err, &d)
}

// UnreadableError is a List error for nftmesh's own objects (its table, its
// chains) holding what the reader does not decode (a counter, a kind of set,
// target or match nftmesh never writes): no plan made them, so Check reports
// drift and Remove deletes them by name all the same. Failing to read at all
// (a socket error, permission) is not one.
type UnreadableError struct{ Err error }

func (e *UnreadableError) Error() string { return e.Err.Error() }
func (e *UnreadableError) Unwrap() error { return e.Err }

// Unreadable wraps err, when not nil, in an *UnreadableError.
func Unreadable(err error) error {
	if err == nil {
		return nil
	}
	return &UnreadableError{Err: err}
}

// IsUnreadable reports whether err is (or wraps) an *UnreadableError.
func IsUnreadable(err error) bool {
	var u *UnreadableError
	return errors.As(err, &u)
}

// CheckAgainst is the Check every backend can share: List, then Diff. What
// List cannot decode of ours is drift, its one line saying what.
func CheckAgainst(ctx context.Context, b Backend, netns string, want Plan) error {
	got, err := b.List(ctx, netns)
	if IsUnreadable(err) {
		return &DriftError{Lines: []string{"+ what nftmesh does not write: " + err.Error()}}
	}
	if err != nil {
		return err
	}
	if d := Diff(want, got); len(d) > 0 {
		return &DriftError{Lines: d}
	}
	return nil
}
