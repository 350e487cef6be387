// Package yamljson converts one YAML document to JSON: the YAML that
// Kubernetes manifests are written in (block and flow collections, plain,
// quoted and block scalars, comments, document markers, YAML 1.1 scalar
// resolution), giving exactly the JSON that sigs.k8s.io/yaml's YAMLToJSON
// gives for every input it accepts.
//
// It exists so that a short-lived process that reads a manifest does not
// link go.yaml.in/yaml/v2, whose package initialisation (regular
// expressions, lookup tables) every process start pays whether it reads
// YAML or not. This package has no package-level state to initialise.
//
// What it does not read it refuses with an error naming the line and the
// construct, never guessing: anchors and aliases, tags, collections as
// keys, merge keys, directives, several documents, tabs used as
// indentation or separation, carriage returns (but in "\r\n") and other line breaks than
// "\n", floating-point, null and large unsigned keys, and indentation that
// YAML allows but reads surprisingly. Every refusal is either an input
// sigs.k8s.io/yaml also refuses or one outside what kubectl and people
// write in manifests; whatever kubectl prints is read (FuzzReadsKubectl).
package yamljson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// Error is a refusal: the 1-based line and what was found there.
type Error struct {
	Line int
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("yaml: line %d: %s", e.Line, e.Msg) }

// maxDepth bounds nesting; a manifest is a few levels deep.
const maxDepth = 1000

// maxKey bounds an implicit key's length in bytes: YAML parsers look at
// most 1024 characters ahead for the ":" that makes a scalar a key.
const maxKey = 1000

// ToJSON converts one YAML document (JSON is YAML) to JSON, as
// sigs.k8s.io/yaml.YAMLToJSON does.
func ToJSON(y []byte) ([]byte, error) {
	v, err := Decode(y)
	if err != nil {
		return nil, err
	}
	return marshal(v, y)
}

// Decode reads one YAML document into the values encoding/json works
// with: map[string]any, []any, string, bool, nil, and for numbers int64,
// uint64 (integers above math.MaxInt64) or float64, as YAML 1.1 resolves
// them. Keys that are integers or booleans become their decimal or
// "true"/"false" text. A float may be NaN or infinite, which JSON cannot
// carry: ToJSON refuses those, Unmarshal turns them into text where a
// string is wanted.
func Decode(y []byte) (any, error) {
	// A file saved on Windows ends its lines with "\r\n": YAML reads that
	// as one line break, as it reads "\n" (in the content of a scalar, too),
	// so it is read as "\n". A lone "\r" is still refused (check).
	if bytes.Contains(y, []byte("\r\n")) {
		y = bytes.ReplaceAll(y, []byte("\r\n"), []byte("\n"))
	}
	p := &parser{src: y}
	if err := p.check(); err != nil {
		return nil, err
	}
	return p.document()
}

// marshal encodes v, naming the line of the first value JSON cannot carry.
func marshal(v any, src []byte) ([]byte, error) {
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("converting YAML to JSON: %w", err)
	}
	return out, nil
}

type parser struct {
	src   []byte
	pos   int
	depth int
}

func (p *parser) lineAt(pos int) int {
	if pos > len(p.src) {
		pos = len(p.src)
	}
	return 1 + bytes.Count(p.src[:pos], []byte{'\n'})
}

func (p *parser) errAt(pos int, format string, args ...any) error {
	return &Error{Line: p.lineAt(pos), Msg: fmt.Sprintf(format, args...)}
}

// snippet quotes at most 24 bytes of the input from pos, for errors.
func (p *parser) snippet(pos int) string {
	end := pos
	for end < len(p.src) && end-pos < 24 && p.src[end] != '\n' {
		_, n := utf8.DecodeRune(p.src[end:])
		end += n
	}
	s := strconv.Quote(string(p.src[pos:end]))
	if end < len(p.src) && p.src[end] != '\n' {
		s += "..."
	}
	return s
}

// check refuses input that is not UTF-8, holds characters YAML forbids,
// or line breaks other than "\n" (which YAML reads in ways this package
// does not follow; Decode has made "\r\n" "\n").
func (p *parser) check() error {
	for i := 0; i < len(p.src); {
		c := p.src[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '\r':
				return p.errAt(i, "carriage return: only \"\\n\" line breaks are supported")
			case c < 0x20 && c != '\n' && c != '\t', c == 0x7f:
				return p.errAt(i, "control character %#02x", c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRune(p.src[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			return p.errAt(i, "invalid UTF-8")
		case r == 0x85 || r == 0x2028 || r == 0x2029:
			return p.errAt(i, "line break character %U: only \"\\n\" line breaks are supported", r)
		case r == 0xfeff:
			return p.errAt(i, "byte order mark U+FEFF is not supported")
		case r < 0xa0, r >= 0xd800 && r < 0xe000, r > 0xfffd && r < 0x10000:
			return p.errAt(i, "control character %U", r)
		}
		i += n
	}
	return nil
}

func (p *parser) at(i int) byte {
	if i < len(p.src) {
		return p.src[i]
	}
	return 0
}

// blankz: a space, tab, line break or the end.
func (p *parser) blankz(i int) bool {
	c := p.at(i)
	return i >= len(p.src) || c == ' ' || c == '\t' || c == '\n'
}

func (p *parser) lineStart(i int) int {
	return bytes.LastIndexByte(p.src[:i], '\n') + 1
}

func (p *parser) col(i int) int { return i - p.lineStart(i) }

// docMarker: "---" or "..." at the start of a line, then a blank or the end.
func (p *parser) docMarker(i int) bool {
	if i > 0 && p.src[i-1] != '\n' || i+3 > len(p.src) {
		return false
	}
	s := p.src[i : i+3]
	return (string(s) == "---" || string(s) == "...") && p.blankz(i+3)
}

// Where peek stopped.
const (
	atContent = iota
	atEnd
	atMarker
)

// peek skips blank and comment lines from a line start (or from the first
// character of a content line, where it stays) and stops at the first
// character of the next content line, returning its column.
func (p *parser) peek() (col, what int, err error) {
	for {
		for p.at(p.pos) == ' ' {
			p.pos++
		}
		switch c := p.at(p.pos); {
		case p.pos >= len(p.src):
			return 0, atEnd, nil
		case c == '\n':
			p.pos++
		case c == '#':
			p.skipComment()
		case c == '\t':
			return 0, 0, p.errAt(p.pos, "tab character in indentation")
		default:
			if p.docMarker(p.pos) {
				return 0, atMarker, nil
			}
			return p.col(p.pos), atContent, nil
		}
	}
}

// skipComment skips to the start of the next line.
func (p *parser) skipComment() {
	if i := bytes.IndexByte(p.src[p.pos:], '\n'); i >= 0 {
		p.pos += i + 1
	} else {
		p.pos = len(p.src)
	}
}

// endLine requires the rest of the line to be spaces and a comment, and
// moves to the next line's start.
func (p *parser) endLine() error {
	for p.at(p.pos) == ' ' {
		p.pos++
	}
	hadSpace := p.pos > 0 && (p.src[p.pos-1] == ' ' || p.src[p.pos-1] == '\t')
	switch c := p.at(p.pos); {
	case p.pos >= len(p.src):
		return nil
	case c == '\n':
		p.pos++
		return nil
	case c == '#' && hadSpace:
		p.skipComment()
		return nil
	case c == '\t':
		return p.errAt(p.pos, "tab character between tokens")
	case c == '#':
		return p.errAt(p.pos, "comment not preceded by a space")
	case c == ':':
		return p.errAt(p.pos, "mapping value (\": \") not allowed here")
	default:
		return p.errAt(p.pos, "unexpected content %s after a value", p.snippet(p.pos))
	}
}

func (p *parser) document() (any, error) {
	col, what, err := p.peek()
	if err != nil {
		return nil, err
	}
	if what == atContent && col == 0 && p.at(p.pos) == '%' {
		return nil, p.errAt(p.pos, "directive %s is not supported", p.snippet(p.pos))
	}
	if what == atMarker && p.src[p.pos] == '-' {
		p.pos += 3
		if err := p.endLine(); err != nil {
			if e, ok := err.(*Error); ok {
				e.Msg = "content after \"---\" on its line is not supported"
			}
			return nil, err
		}
		if col, what, err = p.peek(); err != nil {
			return nil, err
		}
	}
	var v any
	if what == atContent {
		if v, err = p.blockNode(-1, col, true); err != nil {
			return nil, err
		}
		if _, what, err = p.peek(); err != nil {
			return nil, err
		}
	}
	switch {
	case what == atContent:
		return nil, p.errAt(p.pos, "unexpected content %s after the document's top-level node (check its indentation)", p.snippet(p.pos))
	case what == atMarker && p.src[p.pos] == '-':
		return nil, p.errAt(p.pos, "a second document (\"---\"): convert one document at a time")
	case what == atMarker && v == nil:
		return nil, p.errAt(p.pos, "document end (\"...\") after an empty document")
	case what == atMarker:
		p.pos += 3
		if err := p.endLine(); err != nil {
			return nil, err
		}
		if _, what, err = p.peek(); err != nil {
			return nil, err
		}
		if what != atEnd {
			return nil, p.errAt(p.pos, "content after the document end (\"...\"): convert one document at a time")
		}
	}
	return v, nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > maxDepth {
		return p.errAt(p.pos, "nesting deeper than %d levels", maxDepth)
	}
	return nil
}

// blockNode parses the node whose first character is at p.pos, in column
// col, inside a block collection whose indentation is parent (-1 at the
// top). collections says whether a block sequence or mapping may start
// here: not after "key: " on the same line. It returns with p.pos at the
// start of a line.
func (p *parser) blockNode(parent, col int, collections bool) (any, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	start := p.pos
	c := p.at(start)
	switch {
	case c == '-' && p.blankz(start+1):
		if !collections {
			return nil, p.errAt(start, "block sequence entry (\"- \") not allowed after a key on the same line")
		}
		return p.blockSeq(col)
	case c == '?' && p.blankz(start+1):
		if !collections {
			return nil, p.errAt(start, "explicit key (\"? \") not allowed after a key on the same line")
		}
		return p.blockMap(col, start)
	case c == '&':
		return nil, p.errAt(start, "anchor %s is not supported", p.snippet(start))
	case c == '*':
		return nil, p.errAt(start, "alias %s is not supported", p.snippet(start))
	case c == '!':
		return nil, p.errAt(start, "tag %s is not supported", p.snippet(start))
	case c == '|' || c == '>':
		return p.blockScalar(parent)
	case c == '[' || c == '{':
		v, err := p.flowNode()
		if err != nil {
			return nil, err
		}
		if p.skipInlineSpace(); p.at(p.pos) == ':' {
			return nil, p.errAt(p.pos, "flow collection as a mapping key is not supported")
		}
		return v, p.endLine()
	case c == '"' || c == '\'':
		s, err := p.quoted(parent)
		if err != nil {
			return nil, err
		}
		end := p.pos
		if p.skipInlineSpace(); p.at(p.pos) == ':' && p.blankz(p.pos+1) {
			if !collections {
				return nil, p.errAt(p.pos, "mapping value (\": \") not allowed after a key on the same line")
			}
			if bytes.IndexByte(p.src[start:end], '\n') >= 0 {
				return nil, p.errAt(start, "quoted mapping key spans lines")
			}
			return p.blockMap(col, start)
		}
		p.pos = end
		return s, p.endLine()
	}
	s, _, colon, err := p.plain(false, parent)
	if err != nil {
		return nil, err
	}
	if colon {
		if !collections {
			return nil, p.errAt(p.pos, "mapping value (\": \") not allowed after a key on the same line")
		}
		return p.blockMap(col, start)
	}
	return resolve(s), nil
}

func (p *parser) skipInlineSpace() {
	for p.at(p.pos) == ' ' {
		p.pos++
	}
}

// blockSeq parses a block sequence whose "- " entries are in column col,
// starting at the first entry's "-".
func (p *parser) blockSeq(col int) (any, error) {
	out := []any{}
	for {
		p.pos++ // the "-"
		p.skipInlineSpace()
		var item any
		switch c := p.at(p.pos); {
		case p.pos >= len(p.src) || c == '\n' || c == '#' && p.src[p.pos-1] == ' ':
			if err := p.endLine(); err != nil {
				return nil, err
			}
			v, err := p.blockValue(col, false)
			if err != nil {
				return nil, err
			}
			item = v
		case c == '\t':
			return nil, p.errAt(p.pos, "tab character after \"-\"")
		default:
			v, err := p.blockNode(col, p.col(p.pos), true)
			if err != nil {
				return nil, err
			}
			item = v
		}
		out = append(out, item)
		if more, err := p.sameIndent(col, "the sequence's entries"); err != nil {
			return nil, err
		} else if !more {
			return out, nil
		}
		if !(p.at(p.pos) == '-' && p.blankz(p.pos+1)) {
			// The entries end here; the enclosing mapping decides
			// whether this line is one of its keys.
			return out, nil
		}
	}
}

// blockValue parses the value of a key or sequence entry whose content
// starts on a following line; parent is the column of the key or "-".
// After a key (indentless true), a sequence may start in the key's own
// column, as kubectl prints it.
func (p *parser) blockValue(parent int, indentless bool) (any, error) {
	col, what, err := p.peek()
	if err != nil {
		return nil, err
	}
	if what != atContent || col < parent {
		return nil, nil
	}
	if col == parent {
		if indentless && p.at(p.pos) == '-' && p.blankz(p.pos+1) {
			if err := p.enter(); err != nil {
				return nil, err
			}
			defer func() { p.depth-- }()
			return p.blockSeq(col)
		}
		return nil, nil
	}
	return p.blockNode(parent, col, true)
}

// keyOf is a mapping key as YAML resolves it and as it is written in JSON.
type keyOf struct {
	kind byte // 's' string, 'i' integer, 'b' boolean
	text string
}

// blockMap parses a block mapping whose keys are in column col; the first
// key starts at start.
func (p *parser) blockMap(col, start int) (any, error) {
	out := map[string]any{}
	kinds := map[string]byte{}
	p.pos = start
	for {
		key, hasValue, err := p.blockKey(col)
		if err != nil {
			return nil, err
		}
		if old, ok := kinds[key.text]; ok && old != key.kind {
			return nil, p.errAt(start, "keys of different types both read as %s", strconv.Quote(key.text))
		}
		kinds[key.text] = key.kind
		// p.pos is past the ":", or at the next content line.
		var v any
		if hasValue {
			p.skipInlineSpace()
		}
		switch c := p.at(p.pos); {
		case !hasValue:
		case p.pos >= len(p.src) || c == '\n' || c == '#' && p.src[p.pos-1] == ' ':
			if err := p.endLine(); err != nil {
				return nil, err
			}
			if v, err = p.blockValue(col, true); err != nil {
				return nil, err
			}
		case c == '\t':
			return nil, p.errAt(p.pos, "tab character after \":\"")
		default:
			if v, err = p.blockNode(col, p.col(p.pos), false); err != nil {
				return nil, err
			}
		}
		out[key.text] = v
		if more, err := p.sameIndent(col, "the mapping's keys"); err != nil {
			return nil, err
		} else if !more {
			return out, nil
		}
		if p.at(p.pos) == '-' && p.blankz(p.pos+1) {
			return nil, p.errAt(p.pos, "sequence entry (\"- \") where a mapping key is expected")
		}
		start = p.pos
	}
}

// blockKey reads a key of the mapping in column col at p.pos and its
// ":", after which p.pos is. An explicit key ("? ") may have no ":" line:
// then hasValue is false and p.pos is at the next content line.
func (p *parser) blockKey(col int) (k keyOf, hasValue bool, err error) {
	start := p.pos
	c := p.at(start)
	switch {
	case c == '?' && p.blankz(start+1):
		return p.explicitKey(col)
	case c == '"' || c == '\'':
		s, err := p.quoted(1 << 30) // a key is one line; checked below
		if err != nil {
			return k, false, err
		}
		k = keyOf{'s', s}
		p.skipInlineSpace()
	case c == '-' && p.blankz(start+1):
		return k, false, p.errAt(start, "%s where a mapping key is expected", p.snippet(start))
	case c == '[' || c == '{':
		return k, false, p.errAt(start, "flow collection as a mapping key is not supported")
	case c == '&' || c == '*' || c == '!' || c == '|' || c == '>':
		return k, false, p.errAt(start, "%s where a mapping key is expected (anchors, aliases, tags and block scalars are not supported as keys)", p.snippet(start))
	default:
		s, colon, err := p.plainKey()
		if err != nil {
			return k, false, err
		}
		if !colon {
			return k, false, p.errAt(start, "%s: expected a mapping key followed by \": \"", p.snippet(start))
		}
		if k, err = p.resolveKey(start, s); err != nil {
			return k, false, err
		}
	}
	if !(p.at(p.pos) == ':' && p.blankz(p.pos+1)) || bytes.IndexByte(p.src[start:p.pos], '\n') >= 0 {
		return k, false, p.errAt(start, "%s: expected a mapping key followed by \": \" on the same line", p.snippet(start))
	}
	if p.pos-start > maxKey {
		return k, false, p.errAt(start, "mapping key longer than %d bytes", maxKey)
	}
	p.pos++
	return k, true, nil
}

// explicitKey reads "? KEY", KEY a scalar (of any style, on any number of
// lines), and the ":" in column col on the next content line if there is
// one. kubectl writes keys longer than 128 characters, or holding line
// breaks, so; a collection as a key is refused.
func (p *parser) explicitKey(col int) (k keyOf, hasValue bool, err error) {
	p.pos++
	p.skipInlineSpace()
	start := p.pos
	switch c := p.at(start); {
	case c == '"' || c == '\'':
		s, err := p.quoted(col)
		if err != nil {
			return k, false, err
		}
		if err := p.endLine(); err != nil {
			return k, false, err
		}
		k = keyOf{'s', s}
	case c == '|' || c == '>':
		s, err := p.blockScalar(col)
		if err != nil {
			return k, false, err
		}
		k = keyOf{'s', s.(string)}
	case p.pos >= len(p.src) || c == '\n' || c == '#':
		return k, false, p.errAt(start, "explicit key (\"? \") without a key on its line")
	case c == '\t':
		return k, false, p.errAt(start, "tab character after \"?\"")
	case c == '-' || c == '?' || c == ':' || c == '[' || c == '{' || c == '&' || c == '*' || c == '!':
		return k, false, p.errAt(start, "explicit key %s: only a scalar is supported", p.snippet(start))
	default:
		s, _, colon, err := p.plain(false, col)
		if err != nil {
			return k, false, err
		}
		if colon {
			return k, false, p.errAt(start, "mapping as an explicit key is not supported")
		}
		if k, err = p.resolveKey(start, s); err != nil {
			return k, false, err
		}
	}
	next, what, err := p.peek()
	if err != nil {
		return k, false, err
	}
	if what == atContent && next == col && p.at(p.pos) == ':' && p.blankz(p.pos+1) {
		p.pos++
		return k, true, nil
	}
	return k, false, nil
}

// plainKey reads a one-line plain scalar in block context up to ": ".
func (p *parser) plainKey() (string, bool, error) {
	start := p.pos
	if err := p.plainStart(false); err != nil {
		return "", false, err
	}
	end := start
	for i := start; ; {
		switch c := p.at(i); {
		case i >= len(p.src) || c == '\n':
			p.pos = end
			return string(p.src[start:end]), false, nil
		case c == ':' && p.blankz(i+1):
			p.pos = i
			return string(p.src[start:end]), true, nil
		case (c == ' ' || c == '\t') && p.at(i+1) == '#':
			p.pos = end
			return string(p.src[start:end]), false, nil
		case c == ' ' || c == '\t':
			i++
		default:
			i++
			end = i
		}
	}
}

// plainStart refuses what cannot start a plain scalar.
func (p *parser) plainStart(flow bool) error {
	i := p.pos
	switch c := p.at(i); c {
	case '-':
		if c2 := p.at(i + 1); i+1 >= len(p.src) || c2 == ' ' || c2 == '\t' || c2 == '\n' {
			return p.errAt(i, "block sequence entry (\"- \") not allowed here")
		}
	case '?', ':':
		if flow || p.blankz(i+1) {
			return p.errAt(i, "%s cannot start a value here", p.snippet(i))
		}
	case ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '\'', '"', '%', '@', '`':
		return p.errAt(i, "%s cannot start a plain scalar", p.snippet(i))
	case ' ', '\t', '\n':
		return p.errAt(i, "unexpected white space")
	}
	return nil
}

// plain reads a plain scalar, following the YAML scanner's folding of
// lines; in block context continuation lines must be indented past parent.
// colon reports that it stopped at ": " (the scalar is a key, which must
// be on one line). In block context it returns with p.pos at a line start
// unless colon.
func (p *parser) plain(flow bool, parent int) (string, int, bool, error) {
	start := p.pos
	if err := p.plainStart(flow); err != nil {
		return "", 0, false, err
	}
	contentEnd := start
	indent := parent + 1
	var s, ws []byte
	leadingBlanks := false
	trailingBreaks := 0
	colon := false
	for {
		if p.docMarker(p.pos) || p.at(p.pos) == '#' {
			break
		}
		if leadingBlanks && p.pos < len(p.src) {
			// A continuation line. Indicators starting it are read as
			// text by YAML, but are more likely a mistake: refuse.
			switch c := p.at(p.pos); {
			case !flow && (c == '-' || c == '?' || c == ':' || c == ',' || c == '[' || c == ']' || c == '{' || c == '}' ||
				c == '&' || c == '*' || c == '!' || c == '|' || c == '>' || c == '\'' || c == '"' || c == '%' || c == '@' || c == '`'):
				return "", 0, false, p.errAt(p.pos, "plain scalar continues on a line starting with %s", p.snippet(p.pos))
			}
		}
		stopped := false
		for !p.blankz(p.pos) {
			c := p.src[p.pos]
			if c == ':' && p.blankz(p.pos+1) {
				colon, stopped = true, true
				break
			}
			if flow && (c == ',' || c == '?' || c == '[' || c == ']' || c == '{' || c == '}') {
				stopped = true
				break
			}
			if leadingBlanks {
				if trailingBreaks == 0 {
					s = append(s, ' ')
				} else {
					for range trailingBreaks {
						s = append(s, '\n')
					}
				}
				trailingBreaks, leadingBlanks = 0, false
			} else if len(ws) > 0 {
				s = append(s, ws...)
				ws = ws[:0]
			}
			s = append(s, c)
			p.pos++
			contentEnd = p.pos
		}
		if stopped || p.pos >= len(p.src) {
			break
		}
		for {
			c := p.at(p.pos)
			if c == ' ' || c == '\t' {
				if leadingBlanks {
					if c == '\t' {
						return "", 0, false, p.errAt(p.pos, "tab character in indentation")
					}
				} else {
					ws = append(ws, c)
				}
				p.pos++
			} else if c == '\n' && p.pos < len(p.src) {
				if !leadingBlanks {
					ws = ws[:0]
					leadingBlanks = true
				} else {
					trailingBreaks++
				}
				p.pos++
			} else {
				break
			}
		}
		if !flow && leadingBlanks && p.col(p.pos) < indent {
			break
		}
	}
	if colon && bytes.IndexByte(p.src[start:p.pos], '\n') >= 0 {
		return "", 0, false, p.errAt(start, "mapping value (\": \") after a plain scalar that spans lines (check the indentation)")
	}
	if flow || colon {
		return string(s), contentEnd, colon, nil
	}
	if leadingBlanks {
		p.pos = p.lineStart(p.pos)
	} else if err := p.endLine(); err != nil {
		return "", 0, false, err
	}
	return string(s), contentEnd, false, nil
}

// resolveKey resolves a plain key as YAML 1.1 does and names it as JSON
// does. Keys YAML reads as null, floating-point numbers or integers above
// math.MaxInt64 are refused: JSON has no null key, and the text of a
// float key can collide with another key's in ways this package does not
// reproduce.
func (p *parser) resolveKey(pos int, s string) (keyOf, error) {
	if s == "<<" {
		return keyOf{}, p.errAt(pos, "merge key \"<<\" is not supported")
	}
	switch v := resolve(s).(type) {
	case string:
		return keyOf{'s', v}, nil
	case int64:
		return keyOf{'i', strconv.FormatInt(v, 10)}, nil
	case bool:
		if v {
			return keyOf{'b', "true"}, nil
		}
		return keyOf{'b', "false"}, nil
	case nil:
		return keyOf{}, p.errAt(pos, "null mapping key %s", strconv.Quote(s))
	default:
		return keyOf{}, p.errAt(pos, "mapping key %s is a number that is not a signed 64-bit integer: not supported", p.snippet(pos))
	}
}

// resolve gives a plain scalar its YAML 1.1 type, as go.yaml.in/yaml/v2
// does: null, booleans (yes/no/on/off/y/n in three cases), integers in
// decimal, 0x, 0o, 0b and leading-zero octal with "_" separators, floats,
// .inf and .nan; anything else is a string.
func resolve(s string) any {
	if s == "" {
		return nil
	}
	switch s {
	case "~", "null", "Null", "NULL":
		return nil
	case "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON":
		return true
	case "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF":
		return false
	case ".nan", ".NaN", ".NAN":
		return math.NaN()
	case ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF":
		return math.Inf(1)
	case "-.inf", "-.Inf", "-.INF":
		return math.Inf(-1)
	}
	switch c := s[0]; {
	case c == '.':
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return f
		}
	case c == '+' || c == '-' || c >= '0' && c <= '9':
		plain := s
		if bytes.IndexByte([]byte(s), '_') >= 0 {
			plain = string(bytes.ReplaceAll([]byte(s), []byte("_"), nil))
		}
		if i, err := strconv.ParseInt(plain, 0, 64); err == nil {
			return i
		}
		if u, err := strconv.ParseUint(plain, 0, 64); err == nil {
			return u
		}
		if yamlFloat(plain) {
			if f, err := strconv.ParseFloat(plain, 64); err == nil {
				return f
			}
		}
		if len(plain) > 2 && plain[:2] == "0b" {
			if i, err := strconv.ParseInt(plain[2:], 2, 64); err == nil {
				return i
			}
			if u, err := strconv.ParseUint(plain[2:], 2, 64); err == nil {
				return u
			}
		} else if len(plain) > 3 && plain[:3] == "-0b" {
			if i, err := strconv.ParseInt("-"+plain[3:], 2, 64); err == nil {
				return i
			}
		}
	}
	return s
}

// yamlFloat matches [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
func yamlFloat(s string) bool {
	i := 0
	digits := func() int {
		n := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	} else {
		if digits() == 0 {
			return false
		}
		if i < len(s) && s[i] == '.' {
			i++
			digits()
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}

// quoted reads a single- or double-quoted scalar, following the YAML
// scanner's escapes and folding; continuation lines must be indented past
// parent. p.pos ends after the closing quote.
func (p *parser) quoted(parent int) (string, error) {
	start := p.pos
	single := p.src[start] == '\''
	p.pos++
	var s, ws []byte
	leadingBlanks := false
	trailingBreaks := 0
	for {
		if p.docMarker(p.pos) {
			return "", p.errAt(p.pos, "document marker inside a quoted scalar")
		}
		if p.pos >= len(p.src) {
			return "", p.errAt(start, "quoted scalar %s is not closed", p.snippet(start))
		}
		if leadingBlanks && p.col(p.pos) <= parent {
			return "", p.errAt(p.pos, "quoted scalar continues at or left of its parent's indentation")
		}
		lb := false
		for !p.blankz(p.pos) {
			c := p.src[p.pos]
			if single && c == '\'' && p.at(p.pos+1) == '\'' {
				s = append(s, '\'')
				p.pos += 2
			} else if single && c == '\'' || !single && c == '"' {
				break
			} else if !single && c == '\\' && p.at(p.pos+1) == '\n' && p.pos+1 < len(p.src) {
				p.pos += 2
				lb = true
				break
			} else if !single && c == '\\' {
				var err error
				if s, err = p.escape(s, start); err != nil {
					return "", err
				}
			} else {
				s = append(s, c)
				p.pos++
			}
		}
		if c := p.at(p.pos); p.pos < len(p.src) && (single && c == '\'' || !single && c == '"') {
			p.pos++
			return string(s), nil
		}
		// Blanks and breaks; an escaped break counts as a break that
		// folds to nothing.
		leadingBreak := false
		if lb {
			leadingBlanks = true
		} else {
			leadingBlanks = false
		}
		for {
			c := p.at(p.pos)
			if p.pos >= len(p.src) {
				break
			}
			if c == ' ' || c == '\t' {
				if !leadingBlanks {
					ws = append(ws, c)
				}
				p.pos++
			} else if c == '\n' {
				if !leadingBlanks {
					ws = ws[:0]
					leadingBreak = true
					leadingBlanks = true
				} else {
					trailingBreaks++
				}
				p.pos++
			} else {
				break
			}
		}
		if leadingBlanks {
			if leadingBreak && trailingBreaks == 0 {
				s = append(s, ' ')
			} else {
				for range trailingBreaks {
					s = append(s, '\n')
				}
			}
			trailingBreaks = 0
		} else {
			s = append(s, ws...)
			ws = ws[:0]
		}
	}
}

// escape appends the character a double-quoted scalar's escape at p.pos
// stands for.
func (p *parser) escape(s []byte, start int) ([]byte, error) {
	n := 0
	switch c := p.at(p.pos + 1); c {
	case '0':
		s = append(s, 0)
	case 'a':
		s = append(s, 7)
	case 'b':
		s = append(s, 8)
	case 't', '\t':
		s = append(s, 9)
	case 'n':
		s = append(s, 10)
	case 'v':
		s = append(s, 11)
	case 'f':
		s = append(s, 12)
	case 'r':
		s = append(s, 13)
	case 'e':
		s = append(s, 0x1b)
	case ' ', '"', '\'', '\\':
		s = append(s, c)
	case 'N':
		s = utf8.AppendRune(s, 0x85)
	case '_':
		s = utf8.AppendRune(s, 0xa0)
	case 'L':
		s = utf8.AppendRune(s, 0x2028)
	case 'P':
		s = utf8.AppendRune(s, 0x2029)
	case 'x':
		n = 2
	case 'u':
		n = 4
	case 'U':
		n = 8
	default:
		return nil, p.errAt(p.pos, "unknown escape %s in a double-quoted scalar", p.snippet(p.pos))
	}
	p.pos += 2
	if n == 0 {
		return s, nil
	}
	v := 0
	for k := 0; k < n; k++ {
		c := p.at(p.pos + k)
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 + int(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 + int(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 + int(c-'A'+10)
		default:
			return nil, p.errAt(p.pos, "escape needs %d hexadecimal digits", n)
		}
	}
	if v >= 0xd800 && v <= 0xdfff || v > 0x10ffff {
		return nil, p.errAt(p.pos, "escape of invalid Unicode character %#x", v)
	}
	p.pos += n
	return utf8.AppendRune(s, rune(v)), nil
}

// blockScalar reads a literal (|) or folded (>) scalar at p.pos, whose
// enclosing block collection is indented parent, as the YAML scanner does.
func (p *parser) blockScalar(parent int) (any, error) {
	start := p.pos
	literal := p.src[start] == '|'
	p.pos++
	chomp, increment := 0, 0
	isDigit := func(c byte) bool { return c >= '0' && c <= '9' }
	if c := p.at(p.pos); c == '+' || c == '-' {
		chomp = 1
		if c == '-' {
			chomp = -1
		}
		p.pos++
		if c := p.at(p.pos); isDigit(c) {
			if c == '0' {
				return nil, p.errAt(p.pos, "block scalar indentation indicator 0")
			}
			increment = int(c - '0')
			p.pos++
		}
	} else if isDigit(c) {
		if c == '0' {
			return nil, p.errAt(p.pos, "block scalar indentation indicator 0")
		}
		increment = int(c - '0')
		p.pos++
		if c := p.at(p.pos); c == '+' || c == '-' {
			chomp = 1
			if c == '-' {
				chomp = -1
			}
			p.pos++
		}
	}
	for c := p.at(p.pos); c == ' ' || c == '\t'; c = p.at(p.pos) {
		p.pos++
	}
	if p.at(p.pos) == '#' {
		p.skipComment()
	} else if p.pos < len(p.src) && p.src[p.pos] != '\n' {
		return nil, p.errAt(p.pos, "unexpected %s after a block scalar's header", p.snippet(p.pos))
	} else if p.pos < len(p.src) {
		p.pos++
	}
	indent := 0
	if increment > 0 {
		if parent >= 0 {
			indent = parent + increment
		} else {
			indent = increment
		}
	}
	var s, leadingBreak, trailingBreaks []byte
	breaks := func() error {
		maxIndent := 0
		for {
			lineStart := p.lineStart(p.pos)
			for (indent == 0 || p.pos-lineStart < indent) && p.at(p.pos) == ' ' {
				p.pos++
			}
			if p.pos-lineStart > maxIndent {
				maxIndent = p.pos - lineStart
			}
			if (indent == 0 || p.pos-lineStart < indent) && p.at(p.pos) == '\t' {
				return p.errAt(p.pos, "tab character in a block scalar's indentation")
			}
			if p.pos >= len(p.src) || p.src[p.pos] != '\n' {
				break
			}
			trailingBreaks = append(trailingBreaks, '\n')
			p.pos++
		}
		if indent == 0 {
			indent = max(maxIndent, parent+1, 1)
		}
		return nil
	}
	if err := breaks(); err != nil {
		return nil, err
	}
	leadingBlank := false
	for p.col(p.pos) == indent && p.pos < len(p.src) {
		trailingBlank := p.src[p.pos] == ' ' || p.src[p.pos] == '\t'
		if !literal && !leadingBlank && !trailingBlank && len(leadingBreak) > 0 {
			if len(trailingBreaks) == 0 {
				s = append(s, ' ')
			}
		} else {
			s = append(s, leadingBreak...)
		}
		leadingBreak = leadingBreak[:0]
		s = append(s, trailingBreaks...)
		trailingBreaks = trailingBreaks[:0]
		leadingBlank = p.src[p.pos] == ' ' || p.src[p.pos] == '\t'
		end := bytes.IndexByte(p.src[p.pos:], '\n')
		if end < 0 {
			s = append(s, p.src[p.pos:]...)
			p.pos = len(p.src)
			break
		}
		s = append(s, p.src[p.pos:p.pos+end]...)
		p.pos += end + 1
		leadingBreak = append(leadingBreak, '\n')
		if err := breaks(); err != nil {
			return nil, err
		}
	}
	if chomp != -1 {
		s = append(s, leadingBreak...)
	}
	if chomp == 1 {
		s = append(s, trailingBreaks...)
	}
	if p.pos < len(p.src) {
		p.pos = p.lineStart(p.pos)
	}
	return string(s), nil
}

// flowNode reads a flow collection or a scalar inside one, at p.pos;
// every line it continues on must be indented past parent.
func (p *parser) flowNode() (any, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer func() { p.depth-- }()
	switch c := p.at(p.pos); c {
	case '[':
		return p.flowSeq()
	case '{':
		return p.flowMap()
	case '"', '\'':
		return p.quoted(-1)
	case '&', '*', '!':
		return nil, p.errAt(p.pos, "%s: anchors, aliases and tags are not supported", p.snippet(p.pos))
	}
	s, _, _, err := p.plain(true, -1)
	if err != nil {
		return nil, err
	}
	return resolve(s), nil
}

// flowSpace skips spaces, line breaks and comments inside a flow
// collection.
func (p *parser) flowSpace(open int) error {
	for {
		switch c := p.at(p.pos); {
		case p.pos >= len(p.src):
			return p.errAt(open, "flow collection %s is not closed", p.snippet(open))
		case c == ' ':
			p.pos++
		case c == '\n':
			p.pos++
			for p.at(p.pos) == ' ' {
				p.pos++
			}
			if p.docMarker(p.pos) {
				return p.errAt(p.pos, "document marker inside a flow collection")
			}
		case c == '#':
			if prev := p.at(p.pos - 1); p.pos > 0 && prev != ' ' && prev != '\n' {
				return p.errAt(p.pos, "comment not preceded by a space")
			}
			if i := bytes.IndexByte(p.src[p.pos:], '\n'); i >= 0 {
				p.pos += i
			} else {
				p.pos = len(p.src)
			}
		case c == '\t':
			return p.errAt(p.pos, "tab character in a flow collection")
		default:
			return nil
		}
	}
}

// sameIndent looks past blank lines and comments after a block
// collection's entry: more is true when content follows at the
// collection's column col (its next entry), false when the collection
// ended (less indented content, or none); deeper content is refused.
func (p *parser) sameIndent(col int, entries string) (more bool, err error) {
	next, what, err := p.peek()
	if err != nil {
		return false, err
	}
	if what != atContent || next < col {
		return false, nil
	}
	if next > col {
		return false, p.errAt(p.pos, "unexpected indentation: %s is deeper than %s", p.snippet(p.pos), entries)
	}
	return true, nil
}

// flowNext moves past the space and, but before the first entry, the comma
// before the next entry of the flow collection opened at open; end is true
// when the collection's closing character came instead (consumed).
func (p *parser) flowNext(open int, first bool, closing byte, what string) (end bool, err error) {
	if err := p.flowSpace(open); err != nil {
		return false, err
	}
	if p.at(p.pos) == closing {
		p.pos++
		return true, nil
	}
	if first {
		return false, nil
	}
	if p.at(p.pos) != ',' {
		return false, p.errAt(p.pos, "expected \",\" or %q in a flow %s, found %s", string(closing), what, p.snippet(p.pos))
	}
	p.pos++
	if err := p.flowSpace(open); err != nil {
		return false, err
	}
	if p.at(p.pos) == closing {
		p.pos++
		return true, nil
	}
	return false, nil
}

func (p *parser) flowSeq() (any, error) {
	open := p.pos
	p.pos++
	out := []any{}
	for first := true; ; first = false {
		if end, err := p.flowNext(open, first, ']', "sequence"); err != nil {
			return nil, err
		} else if end {
			return out, nil
		}
		v, err := p.flowNode()
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		if err := p.flowSpace(open); err != nil {
			return nil, err
		}
		if p.at(p.pos) == ':' {
			return nil, p.errAt(p.pos, "a key: value pair inside a flow sequence is not supported")
		}
	}
}

func (p *parser) flowMap() (any, error) {
	open := p.pos
	p.pos++
	out := map[string]any{}
	kinds := map[string]byte{}
	for first := true; ; first = false {
		if end, err := p.flowNext(open, first, '}', "mapping"); err != nil {
			return nil, err
		} else if end {
			return out, nil
		}
		start := p.pos
		var key keyOf
		switch c := p.at(start); c {
		case '"', '\'':
			s, err := p.quoted(-1)
			if err != nil {
				return nil, err
			}
			if bytes.IndexByte(p.src[start:p.pos], '\n') >= 0 {
				return nil, p.errAt(start, "mapping key spans lines")
			}
			key = keyOf{'s', s}
		case '[', '{':
			return nil, p.errAt(start, "flow collection as a mapping key is not supported")
		case '&', '*', '!':
			return nil, p.errAt(start, "%s: anchors, aliases and tags are not supported", p.snippet(start))
		default:
			s, end, _, err := p.plain(true, -1)
			if err != nil {
				return nil, err
			}
			if bytes.IndexByte(p.src[start:end], '\n') >= 0 {
				return nil, p.errAt(start, "mapping key spans lines")
			}
			if key, err = p.resolveKey(start, s); err != nil {
				return nil, err
			}
		}
		if err := p.flowSpace(open); err != nil {
			return nil, err
		}
		if p.at(p.pos) == ':' && bytes.IndexByte(p.src[start:p.pos], '\n') >= 0 {
			return nil, p.errAt(start, "mapping key spans lines")
		}
		if p.pos-start > maxKey {
			return nil, p.errAt(start, "mapping key longer than %d bytes", maxKey)
		}
		if old, ok := kinds[key.text]; ok && old != key.kind {
			return nil, p.errAt(start, "keys of different types both read as %s", strconv.Quote(key.text))
		}
		kinds[key.text] = key.kind
		var v any
		if p.at(p.pos) == ':' {
			p.pos++
			if err := p.flowSpace(open); err != nil {
				return nil, err
			}
			if c := p.at(p.pos); c != ',' && c != '}' {
				var err error
				if v, err = p.flowNode(); err != nil {
					return nil, err
				}
				if err := p.flowSpace(open); err != nil {
					return nil, err
				}
			}
		}
		out[key.text] = v
	}
}
