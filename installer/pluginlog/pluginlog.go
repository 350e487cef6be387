// Package pluginlog is the node agent's intake of the standalone plugin's
// events: it follows the log file nftmesh-cni-standalone appends to in the
// agent run dir, re-emits every line in the agent's own log, and hands the
// plugin's decision lines on (OnDecision) to be counted and turned into
// Events. The calls the agent runs itself write no such file: they hand
// their lines and decisions over in process (cniplugin.Server). It logs
// only the plugin's lines, to the writer it is given.
package pluginlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/rs/zerolog"

	"github.com/nftmesh/nftmesh/internal/cnisock"
	"github.com/nftmesh/nftmesh/podinfo/agentsock"
)

// FileName is the plugin's JSON log in the agent run dir (cniplugin's
// LogFileName; rotated to FileName+".1" past its cap).
const FileName = "nftmesh-cni.log"

// Component is the "component" of re-emitted plugin lines.
const Component = "cni-plugin"

// maxPluginLine bounds one buffered line; a longer one is emitted in parts.
const maxPluginLine = 64 << 10

// pluginLogSafetyPoll re-reads the file now and then in case an fsnotify
// event was lost (an overflowing inotify queue drops them).
const pluginLogSafetyPoll = 5 * time.Second

// Follower follows the plugin's log file (fsnotify on the dir, from the
// last offset, through rotation and truncation) and re-emits every line as
// the agent's own with "component":"cni-plugin", keeping its time, level,
// message and fields. Istio uses a unix socket; a file needs nothing
// running for the plugin to log, and survives agent restarts.
type Follower struct {
	dir  string
	path string
	out  zerolog.Logger

	mu      sync.Mutex // one drain at a time: lines never interleave
	f       *os.File
	id      fileID
	offset  int64
	partial []byte
	refused fileID // the last file openAt refused, reported once

	// OnDecision, when set before Run, hears every decision line, on the
	// follower's goroutine: it must not block.
	OnDecision func(agentsock.Decision)
}

type fileID struct{ dev, ino uint64 }

// New follows FileName in runDir, writing the lines to w at level (lines
// below it are dropped).
func New(runDir string, w io.Writer, level zerolog.Level) *Follower {
	return &Follower{dir: runDir, path: filepath.Join(runDir, FileName), out: zerolog.New(w).Level(level)}
}

// Run follows the file until ctx ends, from its end: earlier lines were
// surfaced by an earlier agent, or predate it. It creates the run dir if
// missing, as the installer does.
func (p *Follower) Run(ctx context.Context) error {
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return fmt.Errorf("creating run dir %s for the plugin log: %w", p.dir, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching the plugin log: %w", err)
	}
	defer w.Close()
	if err := w.Add(p.dir); err != nil {
		return fmt.Errorf("watching %s for the plugin log: %w", p.dir, err)
	}
	p.mu.Lock()
	p.openAt(true)
	p.mu.Unlock()
	defer p.close()

	tick := time.NewTicker(pluginLogSafetyPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			p.Drain() // lines written just before shutdown
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if filepath.Base(ev.Name) == FileName {
				p.Drain()
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// An overflow loses events, not data.
			p.out.Warn().Str("component", "nftmesh-agent").Err(err).Msg("watching the plugin log")
			p.Drain()
		case <-tick.C:
			p.Drain()
		}
	}
}

func (p *Follower) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.f != nil {
		_ = p.f.Close()
		p.f = nil
	}
}

// openAt opens the current file, if any yet; atEnd starts after its
// present content. What is not a regular file of its own (a symlink, a
// hard link, a FIFO: see cnisock.OpenFile) is not read, or its lines
// would be re-emitted as the plugin's: it is reported once.
func (p *Follower) openAt(atEnd bool) {
	f, err := cnisock.OpenFile(p.path, os.O_RDONLY, 0)
	if re := (*cnisock.RefusedError)(nil); errors.As(err, &re) {
		if fi, lerr := os.Lstat(p.path); lerr == nil && idOf(fi) != p.refused {
			p.refused = idOf(fi)
			p.out.Warn().Str("component", "nftmesh-agent").Err(err).Msg("not following the plugin log")
		}
	}
	if err != nil {
		return
	}
	fi, err := f.Stat()
	if err != nil || idOf(fi) == (fileID{}) {
		_ = f.Close()
		return
	}
	p.f, p.id, p.offset, p.partial = f, idOf(fi), 0, nil
	if atEnd {
		p.offset = fi.Size()
	}
}

// idOf is fi's device and inode, zero when the file system has none.
func idOf(fi os.FileInfo) fileID {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}
}

// Drain re-emits every complete line appended since the last drain. After
// a rotation it finishes the old file (open under its .1 name), then reads
// the new one from its start; after a truncation it starts over.
func (p *Follower) Drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.f != nil {
		if fi, err := p.f.Stat(); err == nil && fi.Size() < p.offset {
			p.offset, p.partial = 0, nil // truncated in place
		}
		p.readOn()
	}
	fi, err := os.Lstat(p.path)
	if err != nil || idOf(fi) == (fileID{}) {
		return // rotated away and not recreated yet: keep the old file
	}
	if p.f != nil && idOf(fi) == p.id {
		return
	}
	// A new file under the name: the old one is finished.
	if p.f != nil {
		p.flushPartial()
		_ = p.f.Close()
		p.f = nil
	}
	p.openAt(false)
	if p.f != nil {
		p.readOn()
	}
}

func (p *Follower) readOn() {
	buf := make([]byte, 32<<10)
	for {
		n, err := p.f.ReadAt(buf, p.offset)
		if n > 0 {
			p.offset += int64(n)
			p.consume(buf[:n])
		}
		if err != nil || n == 0 {
			return
		}
	}
}

func (p *Follower) consume(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.partial = append(p.partial, b...)
			if len(p.partial) > maxPluginLine {
				p.flushPartial()
			}
			return
		}
		line := b[:i]
		if len(p.partial) > 0 {
			line = append(p.partial, line...)
			p.partial = nil
		}
		p.emit(line)
		b = b[i+1:]
	}
}

func (p *Follower) flushPartial() {
	if len(p.partial) > 0 {
		p.emit(p.partial)
		p.partial = nil
	}
}

// emit writes one plugin line through the agent's logger: level from the
// line, "time" as written, "component":"cni-plugin", the other fields in
// order, the message last. A line that is not a JSON object is the
// message.
func (p *Follower) emit(line []byte) {
	line = bytes.TrimRight(line, "\r")
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	fields, ok := parseLogLine(line)
	if !ok {
		p.out.Info().Str("component", Component).Bool("unparsed", true).Msg(string(line))
		return
	}
	level := zerolog.NoLevel
	var msg string
	var recordOnly bool
	d := agentsock.Decision{Took: -1, LookupTook: -1}
	strs := map[string]*string{zerolog.MessageFieldName: &msg, "command": &d.Command, "decision": &d.Decision,
		"lookup": &d.Lookup, "ran_by": &d.RanBy, "pod": &d.Pod, "namespace": &d.Namespace, "error": &d.Error}
	for _, f := range fields {
		switch f.key {
		case zerolog.LevelFieldName:
			var s string
			if json.Unmarshal(f.raw, &s) == nil {
				if l, err := zerolog.ParseLevel(s); err == nil && s != "" {
					level = l
				}
			}
		case "duration_ms":
			d.Took = msField(f.raw)
		case "lookup_ms":
			d.LookupTook = msField(f.raw)
		case RecordOnlyField:
			_ = json.Unmarshal(f.raw, &recordOnly)
		default:
			if dst := strs[f.key]; dst != nil {
				_ = json.Unmarshal(f.raw, dst)
			}
		}
	}
	d.Command = strings.ToUpper(d.Command)
	if p.OnDecision != nil && d.Decision != "" {
		p.OnDecision(d)
	}
	e := p.out.WithLevel(level)
	if e == nil || recordOnly {
		return // below the agent's level, or below the plugin's
	}
	for _, f := range fields {
		if f.key == zerolog.TimestampFieldName {
			e = e.RawJSON(f.key, f.raw)
		}
	}
	e = e.Str("component", Component)
	for _, f := range fields {
		switch f.key {
		case zerolog.LevelFieldName, zerolog.MessageFieldName, zerolog.TimestampFieldName:
		case "component":
			e = e.RawJSON("plugin_component", f.raw) // never two "component" keys
		default:
			e = e.RawJSON(f.key, f.raw)
		}
	}
	e.Msg(msg)
}

// RecordOnlyField marks a decision line below the plugin's log level
// (cniplugin's RecordOnlyField): counted and timed, never printed.
const RecordOnlyField = "record_only"

// msField reads a milliseconds field, or -1.
func msField(raw json.RawMessage) time.Duration {
	var ms float64
	if json.Unmarshal(raw, &ms) != nil || ms < 0 {
		return -1
	}
	return time.Duration(ms * float64(time.Millisecond))
}

type logField struct {
	key string
	raw json.RawMessage
}

// parseLogLine reads a JSON object's members in order; ok is false for
// anything else (or trailing data).
func parseLogLine(line []byte) ([]logField, bool) {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	var out []logField
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		k, ok := t.(string)
		if !ok {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		out = append(out, logField{key: k, raw: raw})
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return out, true
}
