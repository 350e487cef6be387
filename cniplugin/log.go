package cniplugin

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/nftmesh/nftmesh/internal/cnisock"
	"github.com/nftmesh/nftmesh/podinfo/cniconf"
)

// Log file in agent_run_dir, rotated once to LogFileName+".1" when it
// passes maxLogSize, so a node never fills its disk with plugin logs.
const (
	LogFileName = "nftmesh-cni.log"
	maxLogSize  = 10 << 20
)

// RecordOnlyField marks a decision line written below the plugin's log
// level: the agent counts and times it but does not print it.
const RecordOnlyField = "record_only"

// newLoggers builds the loggers of a plugin run. log writes JSON lines to
// stderr and to the agent's log for a call the agent runs (e.Log), else,
// when agent_run_dir exists, to the capped log file; never to stdout.
// record writes to the log file only, with no level, each line marked
// RecordOnlyField: the run's decision goes there when the log level hides
// it, so the agent's counters and latency histograms (the file is their
// intake for the standalone plugin) see every decision. close closes the
// file.
func newLoggers(e Env, conf *cniconf.Config, command string) (log, record zerolog.Logger, close func()) {
	setLogFormat()
	var w io.Writer = e.Stderr
	close = func() {}
	level := zerolog.InfoLevel
	record = zerolog.Nop()
	var refused error
	if conf != nil {
		if l, err := zerolog.ParseLevel(conf.LogLevel); err == nil && conf.LogLevel != "" {
			level = l
		}
		if conf.LogLevel == "none" {
			level = zerolog.Disabled
		}
		if e.Ask != nil {
			// The agent's run: the agent is told in process, no file.
			if e.Log != nil {
				w = zerolog.MultiLevelWriter(e.Stderr, e.Log)
			}
		} else {
			var f *os.File
			if f, refused = openLogFile(conf.AgentRunDir); f != nil {
				w = zerolog.MultiLevelWriter(e.Stderr, f)
				close = func() { f.Close() }
				record = zerolog.New(f).With().Timestamp().Str("plugin", "nftmesh-cni").Str("command", command).Bool(RecordOnlyField, true).Logger()
			}
		}
	}
	log = zerolog.New(w).Level(level).With().Timestamp().Str("plugin", "nftmesh-cni").Str("command", command).Logger()
	if refused != nil {
		log.Warn().Err(refused).Msg("not writing the plugin's log file: the agent does not see this run")
	}
	return log, record, close
}

// AgentLog is the agent's log for the lines of the calls it runs, at level:
// each marked "component":"cni-plugin", as the agent marks the standalone
// plugin's lines it reads back from the log file.
func AgentLog(w io.Writer, level zerolog.Level) zerolog.LevelWriter {
	return &zerolog.FilteredLevelWriter{Writer: zerolog.LevelWriterAdapter{Writer: agentLines{w}}, Level: level}
}

// agentLines puts the component first in each JSON line it passes on.
type agentLines struct{ w io.Writer }

func (a agentLines) Write(p []byte) (int, error) {
	if len(p) < 2 || p[0] != '{' {
		return a.w.Write(p)
	}
	line := make([]byte, 0, len(p)+len(componentField))
	if _, err := a.w.Write(append(append(append(line, '{'), componentField...), p[1:]...)); err != nil {
		return 0, err
	}
	return len(p), nil
}

const componentField = `"component":"cni-plugin",`

// openLogFile opens the log file for appending, rotating it first when it
// is too big. A missing run dir (agent not installed yet), or one that is
// full, means no file; what is not a regular file of its own there (a
// symlink, a FIFO, a hard link) is refused, with the refusal returned.
func openLogFile(dir string) (*os.File, error) {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, nil
	}
	path := filepath.Join(dir, LogFileName)
	if st, err := os.Lstat(path); err == nil && st.Mode().IsRegular() && st.Size() > maxLogSize {
		// Concurrent plugin runs may both rename; the loser's rename fails
		// or moves an almost empty file, which is harmless. A rename
		// replaces a symlink at the new name, never what it points to.
		_ = os.Rename(path, path+".1")
	}
	f, err := cnisock.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if re := (*cnisock.RefusedError)(nil); errors.As(err, &re) {
		return nil, err
	}
	return f, nil
}

// setLogFormat sets zerolog's package-wide time format once: the agent
// runs calls concurrently. UTC: local time would load /etc/localtime in
// every run, for a log the agent reads by machine.
var setLogFormat = sync.OnceFunc(func() {
	zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
	zerolog.TimestampFunc = func() time.Time { return time.Now().UTC() }
})

func durationMS(start time.Time) float64 {
	return float64(time.Since(start).Microseconds()) / 1000
}
