package cnisock

import (
	"path"
	"unicode/utf8"
)

// DefaultRunDir is agent_run_dir when a config names none (the plugin
// config's default; a test keeps the two equal).
const DefaultRunDir = "/var/run/nftmesh"

// maxDepth bounds the nesting RunDir walks through.
const maxDepth = 1000

// RunDir finds the agent_run_dir of a plugin config without decoding it
// (the front process does not link a JSON decoder): "agent_run_dir", else
// Istio's "cni_agent_run_dir", else DefaultRunDir, as the plugin reads
// them. ok is false when config is not a well-formed JSON object, a key
// comes twice, or the value is not an absolute path string of UTF-8: the plugin
// then reports the config's problem itself. The plugin decodes the config
// again wherever it runs, and the agent declines a call whose config names
// a run dir other than its own, so a config this reads otherwise than the
// plugin (JSON's case-insensitive key matching, say) costs speed, never
// correctness.
func RunDir(config []byte) (dir string, ok bool) {
	s := scanner{b: config}
	var ours, istio *string
	s.space()
	if !s.byte('{') {
		return "", false
	}
	s.space()
	if !s.byte('}') {
		for {
			s.space()
			key, kok := s.str()
			s.space()
			if !kok || !s.byte(':') {
				return "", false
			}
			s.space()
			switch key {
			case "agent_run_dir", "cni_agent_run_dir":
				v, vok := s.str()
				if !vok {
					return "", false
				}
				p := &ours
				if key == "cni_agent_run_dir" {
					p = &istio
				}
				if *p != nil {
					return "", false
				}
				*p = &v
			default:
				if !s.value() {
					return "", false
				}
			}
			s.space()
			if s.byte('}') {
				break
			}
			if !s.byte(',') {
				return "", false
			}
		}
	}
	s.space()
	if s.i != len(s.b) {
		return "", false
	}
	v := istio
	if ours != nil {
		v = ours
	}
	if v == nil || *v == "" {
		return DefaultRunDir, true
	}
	if !path.IsAbs(*v) || !utf8.ValidString(*v) {
		// Not UTF-8: JSON decoders replace what is not, so the plugin
		// would read another path.
		return "", false
	}
	return path.Clean(*v), true
}

// scanner walks JSON text; its methods report whether what they expect is
// there.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) byte(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) lit(l string) bool {
	if len(s.b)-s.i >= len(l) && string(s.b[s.i:s.i+len(l)]) == l {
		s.i += len(l)
		return true
	}
	return false
}

// value skips one JSON value, nested ones without recursion.
func (s *scanner) value() bool {
	// open holds the brackets still to close; after tells whether the
	// next token of the innermost container is a separator or its end.
	var open []byte
	for {
		s.space()
		if s.i >= len(s.b) {
			return false
		}
		switch c := s.b[s.i]; {
		case c == '{' || c == '[':
			if len(open) == maxDepth {
				return false
			}
			s.i++
			open = append(open, c)
			s.space()
			if s.byte(c + 2) { // '}' is '{'+2, ']' is '['+2
				open = open[:len(open)-1]
				break
			}
			if c == '{' {
				if _, ok := s.str(); !ok {
					return false
				}
				s.space()
				if !s.byte(':') {
					return false
				}
			}
			continue
		case c == '"':
			if _, ok := s.str(); !ok {
				return false
			}
		case c == 't':
			if !s.lit("true") {
				return false
			}
		case c == 'f':
			if !s.lit("false") {
				return false
			}
		case c == 'n':
			if !s.lit("null") {
				return false
			}
		default:
			if !s.number() {
				return false
			}
		}
		// A value ended: close what it ends, or go on to the next member.
		for {
			if len(open) == 0 {
				return true
			}
			s.space()
			top := open[len(open)-1]
			if s.byte(top + 2) {
				open = open[:len(open)-1]
				continue
			}
			if !s.byte(',') {
				return false
			}
			if top == '{' {
				s.space()
				if _, ok := s.str(); !ok {
					return false
				}
				s.space()
				if !s.byte(':') {
					return false
				}
			}
			break
		}
	}
}

func (s *scanner) number() bool {
	start := s.i
	s.byte('-')
	switch {
	case s.byte('0'):
	case s.digits() == 0:
		return false
	}
	if s.byte('.') && s.digits() == 0 {
		return false
	}
	if s.byte('e') || s.byte('E') {
		if !s.byte('+') {
			s.byte('-')
		}
		if s.digits() == 0 {
			return false
		}
	}
	return s.i > start
}

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

// str reads a JSON string and returns it decoded, but for \u escapes,
// which stay as written: no key or path the front looks for needs them, and
// a key so written matches none of them (the agent declines a call whose
// config it reads otherwise).
func (s *scanner) str() (string, bool) {
	if !s.byte('"') {
		return "", false
	}
	start := s.i
	simple := true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			if simple {
				return string(v), true
			}
			return unescape(v)
		case c == '\\':
			simple = false
			n := escapeLen(s.b[s.i:])
			if n == 0 {
				return "", false
			}
			s.i += n
		case c < 0x20:
			return "", false
		default:
			s.i++
		}
	}
	return "", false
}

// escapeLen is the length of the escape b starts with (a backslash), or 0
// when it is not one JSON has.
func escapeLen(b []byte) int {
	if len(b) < 2 {
		return 0
	}
	switch b[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if len(b) < 6 {
			return 0
		}
		for _, h := range b[2:6] {
			if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
				return 0
			}
		}
		return 6
	}
	return 0
}

// unescape decodes a string's body (escapes checked by str), leaving \u
// escapes as written.
func unescape(v []byte) (string, bool) {
	out := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i >= len(v) {
			return "", false
		}
		switch v[i] {
		case 'u':
			out = append(out, v[i-1:i+5]...)
			i += 4
		case '"', '\\', '/':
			out = append(out, v[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		default:
			return "", false
		}
	}
	return string(out), true
}
