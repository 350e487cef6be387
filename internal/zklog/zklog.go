// Package zklog routes klog, the logger client-go writes to, into a
// zerolog logger, so that a binary of this project has one log stream:
// JSON lines from its own code and from client-go alike, instead of JSON
// interleaved with klog's plain "E1122 12:00:00.000000 ..." lines on the
// same stderr (which a CNI runtime or a log pipeline cannot parse). It does
// not decide what client-go logs: klog's own verbosity (0) still filters
// first.
package zklog

import (
	"fmt"

	"github.com/go-logr/logr"
	"github.com/rs/zerolog"
	"k8s.io/klog/v2"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Route makes klog write every entry to zl, at info (klog's info and
// warning, and logr verbosity 0), debug (logr verbosity 1 and up) or error.
// Entries carry "logger":"client-go" (or the logr name), so they are told
// apart from the binary's own. Call it once, before any client-go use.
func Route(zl zerolog.Logger) {
	klog.SetLogger(logr.New(&sink{zl: zl, name: "client-go"}))
}

// sink is a logr.LogSink writing zerolog events.
type sink struct {
	zl     zerolog.Logger
	name   string
	values []any
}

var _ logr.LogSink = (*sink)(nil)

func (s *sink) Init(logr.RuntimeInfo) {}

// level maps logr verbosity to zerolog: V(0) is info, anything more
// detailed is debug.
func level(v int) zerolog.Level {
	if v <= 0 {
		return zerolog.InfoLevel
	}
	return zerolog.DebugLevel
}

func (s *sink) Enabled(v int) bool {
	return level(v) >= s.zl.GetLevel() && s.zl.GetLevel() != zerolog.Disabled
}

func (s *sink) Info(v int, msg string, kv ...any) { s.write(s.zl.WithLevel(level(v)), msg, kv) }

func (s *sink) Error(err error, msg string, kv ...any) {
	e := s.zl.Error()
	if err != nil {
		e = e.Str(zerolog.ErrorFieldName, quote.Text(err.Error()))
	}
	s.write(e, msg, kv)
}

func (s *sink) WithValues(kv ...any) logr.LogSink {
	c := *s
	c.values = append(append([]any(nil), s.values...), kv...)
	return &c
}

func (s *sink) WithName(name string) logr.LogSink {
	c := *s
	c.name = s.name + "/" + name
	return &c
}

// write adds the logger name and the key/value pairs (the sink's, then the
// entry's) and sends e. Text is bounded: client-go may quote response
// bodies.
func (s *sink) write(e *zerolog.Event, msg string, kv []any) {
	if e == nil {
		return
	}
	name := s.name
	for _, pairs := range [][]any{s.values, kv} {
		for i := 0; i < len(pairs); i += 2 {
			key, ok := pairs[i].(string)
			if !ok {
				key = fmt.Sprint(pairs[i])
			}
			if i+1 == len(pairs) {
				e = e.Str(key, "(missing value)")
				break
			}
			// klog passes the names of its own loggers (WithName) as a
			// "logger" value: one field, joined to ours.
			if n, ok := pairs[i+1].(string); ok && key == "logger" {
				name += "/" + n
				continue
			}
			e = field(e, key, pairs[i+1])
		}
	}
	e.Str("logger", name).Msg(quote.Text(msg))
}

func field(e *zerolog.Event, key string, v any) *zerolog.Event {
	switch v := v.(type) {
	case string:
		return e.Str(key, quote.Text(v))
	case error:
		return e.Str(key, quote.Text(v.Error()))
	case fmt.Stringer:
		return e.Str(key, quote.Text(v.String()))
	case bool, int, int32, int64, uint, uint32, uint64, float32, float64:
		return e.Interface(key, v)
	default:
		return e.Str(key, quote.Text(fmt.Sprintf("%+v", v)))
	}
}
