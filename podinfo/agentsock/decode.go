package agentsock

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// decodeAnswer decodes an answer's JSON as the plugin reads it: by hand,
// for the one shape an Answer has, because encoding/json's first decode in
// a fresh process (building its decoders for Answer, meshpod.Pod and their
// parts by reflection) costs more than the whole rest of the question.
//
// It accepts what encoding/json's Marshal of an Answer writes, with the
// same result as a strict encoding/json decode (unknown fields refused,
// nothing after the value), and is stricter still where that writer never
// goes: keys must match the field names exactly and appear once, a string
// or number field cannot be null, strings must be valid UTF-8 without lone
// surrogates, numbers must be integers. Anything else is an error naming
// the offset, so the plugin asks the API server instead.
func decodeAnswer(b []byte) (Answer, error) {
	var a Answer
	err := decode(b, "answer", func(d *decoder) (err error) {
		a, err = d.answer()
		return err
	})
	if err != nil {
		return Answer{}, err
	}
	return a, nil
}

// decodeRequest decodes a request's JSON as the agent reads it, with the
// same decoder as the plugin's answers: a request is what encoding/json's
// Marshal of a Request writes (as older plugins send it) or the same
// bytes written by hand (encodeRequest).
func decodeRequest(b []byte) (Request, error) {
	var r Request
	err := decode(b, "request", func(d *decoder) error {
		return d.object(requestFields, func(k int) (err error) {
			switch k {
			case 0:
				var v int64
				v, err = d.integer(strconv.IntSize)
				r.V = int(v)
			case 1:
				r.Namespace, err = d.str()
			case 2:
				r.Name, err = d.str()
			case 3:
				r.UID, err = d.str()
			}
			return err
		})
	})
	if err != nil {
		return Request{}, err
	}
	return r, nil
}

// decode runs value on b, which must hold that one JSON value and nothing
// after it but white space; errors name what and the byte.
func decode(b []byte, what string, value func(*decoder) error) error {
	// One copy of the input backs every string without escapes.
	d := decoder{b: b, s: string(b)}
	err := value(&d)
	if err == nil {
		d.ws()
		if d.i < len(d.b) {
			err = errors.New("trailing data after the JSON value")
		}
	}
	if err != nil {
		return fmt.Errorf("decoding %s %s: at byte %d: %w", what, quote.Value(string(b)), d.i, err)
	}
	return nil
}

type decoder struct {
	b []byte
	s string // b as a string
	i int
}

var errEnd = errors.New("unexpected end of JSON input")

func (d *decoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek is the next byte after white space, 0 at the end.
func (d *decoder) peek() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *decoder) expect(c byte) error {
	switch got := d.peek(); {
	case d.i >= len(d.b):
		return errEnd
	case got != c:
		return fmt.Errorf("found %q where %q belongs", got, c)
	}
	d.i++
	return nil
}

// null consumes a null if one is next.
func (d *decoder) null() bool {
	if d.peek() == 'n' && len(d.b)-d.i >= 4 && string(d.b[d.i:d.i+4]) == "null" {
		d.i += 4
		return true
	}
	return false
}

// object reads an object, calling field for each key with d before its
// value; field must read the value. Keys must be among names (each at
// most once; a bit of seen per name).
func (d *decoder) object(names []string, field func(k int) error) error {
	if err := d.expect('{'); err != nil {
		return err
	}
	if d.peek() == '}' {
		d.i++
		return nil
	}
	var seen uint64
	for {
		at := d.i
		key, err := d.str()
		if err != nil {
			return err
		}
		k := -1
		for j, n := range names {
			if n == key {
				k = j
				break
			}
		}
		switch {
		case k < 0:
			d.i = at
			return fmt.Errorf("unknown field %s", quote.Value(key))
		case seen&(1<<k) != 0:
			d.i = at
			return fmt.Errorf("field %s given twice", quote.Value(key))
		}
		seen |= 1 << k
		if err := d.expect(':'); err != nil {
			return err
		}
		if err := field(k); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return d.expect('}')
		}
	}
}

// array reads an array, calling elem for each element.
func (d *decoder) array(elem func() error) error {
	if err := d.expect('['); err != nil {
		return err
	}
	if d.peek() == ']' {
		d.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch d.peek() {
		case ',':
			d.i++
		case ']':
			d.i++
			return nil
		default:
			return d.expect(']')
		}
	}
}

// str reads a string.
func (d *decoder) str() (string, error) {
	if err := d.expect('"'); err != nil {
		return "", err
	}
	// The usual string: printable ASCII without escapes, taken as it is.
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		if c == '"' {
			d.i++
			return d.s[start : d.i-1], nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		d.i++
	}
	out := append([]byte(nil), d.b[start:d.i]...)
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return string(out), nil
		case c < 0x20:
			return "", fmt.Errorf("control character %#x in a string", c)
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(d.b[d.i:])
			if r == utf8.RuneError && n == 1 {
				return "", errors.New("invalid UTF-8 in a string")
			}
			out = append(out, d.b[d.i:d.i+n]...)
			d.i += n
		case c != '\\':
			out = append(out, c)
			d.i++
		default:
			d.i++
			if d.i >= len(d.b) {
				return "", errEnd
			}
			e := d.b[d.i]
			d.i++
			switch e {
			case '"', '\\', '/':
				out = append(out, e)
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
			case 'u':
				r, err := d.hex4()
				if err != nil {
					return "", err
				}
				if utf16.IsSurrogate(r) {
					// Only a high surrogate followed by a low one is a rune.
					var r2 rune = utf8.RuneError
					if d.i+1 < len(d.b) && d.b[d.i] == '\\' && d.b[d.i+1] == 'u' {
						d.i += 2
						if r2, err = d.hex4(); err != nil {
							return "", err
						}
					}
					if r = utf16.DecodeRune(r, r2); r == utf8.RuneError {
						return "", errors.New("lone UTF-16 surrogate in a string")
					}
				}
				out = utf8.AppendRune(out, r)
			default:
				return "", fmt.Errorf("invalid escape %q in a string", "\\"+string(rune(e)))
			}
		}
	}
	return "", errEnd
}

func (d *decoder) hex4() (rune, error) {
	if len(d.b)-d.i < 4 {
		return 0, errEnd
	}
	v, err := strconv.ParseUint(string(d.b[d.i:d.i+4]), 16, 16)
	if err != nil {
		return 0, fmt.Errorf("invalid \\u escape %q", d.b[d.i:d.i+4])
	}
	d.i += 4
	return rune(v), nil
}

// integer reads a JSON integer (no fraction, no exponent) of bits bits.
func (d *decoder) integer(bits int) (int64, error) {
	d.ws()
	start := d.i
	if d.i < len(d.b) && d.b[d.i] == '-' {
		d.i++
	}
	digits := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	switch {
	case d.i == digits:
		if d.i >= len(d.b) {
			return 0, errEnd
		}
		return 0, fmt.Errorf("found %q where an integer belongs", d.b[d.i])
	case d.b[digits] == '0' && d.i-digits > 1:
		return 0, errors.New("integer with a leading zero")
	case d.i < len(d.b) && (d.b[d.i] == '.' || d.b[d.i] == 'e' || d.b[d.i] == 'E'):
		return 0, errors.New("number is not an integer")
	}
	v, err := strconv.ParseInt(string(d.b[start:d.i]), 10, bits)
	if err != nil {
		return 0, fmt.Errorf("integer %s out of range", d.b[start:d.i])
	}
	return v, nil
}

func (d *decoder) stringMap() (map[string]string, error) {
	if d.null() {
		return nil, nil
	}
	m := map[string]string{}
	if err := d.expect('{'); err != nil {
		return nil, err
	}
	if d.peek() == '}' {
		d.i++
		return m, nil
	}
	for {
		at := d.i
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			d.i = at
			return nil, fmt.Errorf("key %s given twice", quote.Value(k))
		}
		if err := d.expect(':'); err != nil {
			return nil, err
		}
		v, err := d.str()
		if err != nil {
			return nil, err
		}
		m[k] = v
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return m, nil
		default:
			return nil, d.expect('}')
		}
	}
}

func (d *decoder) strings() ([]string, error) {
	if d.null() {
		return nil, nil
	}
	out := []string{}
	err := d.array(func() error {
		s, err := d.str()
		out = append(out, s)
		return err
	})
	return out, err
}

func (d *decoder) optInt64() (*int64, error) {
	if d.null() {
		return nil, nil
	}
	v, err := d.integer(64)
	if err != nil {
		return nil, err
	}
	return &v, nil
}

var (
	requestFields   = []string{"v", "namespace", "name", "uid"}
	answerFields    = []string{"v", "status", "reason", "uid", "pod"}
	podFields       = []string{"Namespace", "Name", "Labels", "Annotations", "InitContainers", "Containers", "PodIPs"}
	containerFields = []string{"Name", "Args", "Env", "RunAsUser", "RunAsGroup"}
	envFields       = []string{"Name", "Value"}
)

func (d *decoder) answer() (Answer, error) {
	var a Answer
	err := d.object(answerFields, func(k int) (err error) {
		switch k {
		case 0:
			var v int64
			v, err = d.integer(strconv.IntSize)
			a.V = int(v)
		case 1:
			a.Status, err = d.str()
		case 2:
			a.Reason, err = d.str()
		case 3:
			a.UID, err = d.str()
		case 4:
			if !d.null() {
				a.Pod, err = d.pod()
			}
		}
		return err
	})
	return a, err
}

func (d *decoder) pod() (*meshpod.Pod, error) {
	p := &meshpod.Pod{}
	err := d.object(podFields, func(k int) (err error) {
		switch k {
		case 0:
			p.Namespace, err = d.str()
		case 1:
			p.Name, err = d.str()
		case 2:
			p.Labels, err = d.stringMap()
		case 3:
			p.Annotations, err = d.stringMap()
		case 4:
			p.InitContainers, err = d.containers()
		case 5:
			p.Containers, err = d.containers()
		case 6:
			p.PodIPs, err = d.strings()
		}
		return err
	})
	return p, err
}

func (d *decoder) containers() ([]meshpod.Container, error) {
	if d.null() {
		return nil, nil
	}
	out := []meshpod.Container{}
	err := d.array(func() error {
		var c meshpod.Container
		err := d.object(containerFields, func(k int) (err error) {
			switch k {
			case 0:
				c.Name, err = d.str()
			case 1:
				c.Args, err = d.strings()
			case 2:
				c.Env, err = d.env()
			case 3:
				c.RunAsUser, err = d.optInt64()
			case 4:
				c.RunAsGroup, err = d.optInt64()
			}
			return err
		})
		out = append(out, c)
		return err
	})
	return out, err
}

func (d *decoder) env() ([]meshpod.EnvVar, error) {
	if d.null() {
		return nil, nil
	}
	out := []meshpod.EnvVar{}
	err := d.array(func() error {
		var e meshpod.EnvVar
		err := d.object(envFields, func(k int) (err error) {
			if k == 0 {
				e.Name, err = d.str()
			} else {
				e.Value, err = d.str()
			}
			return err
		})
		out = append(out, e)
		return err
	})
	return out, err
}
