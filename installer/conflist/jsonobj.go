package conflist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// object is a JSON object that keeps its members' order and their values'
// bytes, so a primary config we edit keeps the primary's key order and its
// plugins' content exactly; only whitespace changes.
type object struct {
	members []member
}

type member struct {
	key string
	val json.RawMessage
}

// parseObject decodes one JSON object and nothing after it. A duplicated key
// keeps its first position and its last value, which is the value
// encoding/json (and so libcni) sees.
func parseObject(b []byte) (*object, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("decoding JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("decoding JSON: not an object")
	}
	o := &object{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("decoding JSON: %w", err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, errors.New("decoding JSON: object key is not a string")
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("decoding JSON value of %q: %w", key, err)
		}
		o.set(key, v)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("decoding JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("decoding JSON: data after the object")
	}
	return o, nil
}

func (o *object) get(key string) (json.RawMessage, bool) {
	for _, m := range o.members {
		if m.key == key {
			return m.val, true
		}
	}
	return nil, false
}

func (o *object) set(key string, v json.RawMessage) {
	for i := range o.members {
		if o.members[i].key == key {
			o.members[i].val = v
			return
		}
	}
	o.members = append(o.members, member{key: key, val: v})
}

func (o *object) del(key string) {
	o.members = slices.DeleteFunc(o.members, func(m member) bool { return m.key == key })
}

// getString returns a member that is a JSON string, else "".
func (o *object) getString(key string) string {
	var s string
	if v, ok := o.get(key); ok && json.Unmarshal(v, &s) != nil {
		return ""
	}
	return s
}

// plugins returns the entries of the "plugins" member, each as its bytes;
// nil when there is no such member.
func (o *object) plugins() ([]json.RawMessage, error) {
	raw, ok := o.get("plugins")
	if !ok {
		return nil, nil
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(raw, &plugins); err != nil {
		return nil, fmt.Errorf("parsing plugins: %w", err)
	}
	if plugins == nil {
		plugins = []json.RawMessage{}
	}
	return plugins, nil
}

// marshal encodes the object indented by two spaces with a final newline,
// the way most CNI installers write their files.
func (o *object) marshal() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, m := range o.members {
		if i > 0 {
			buf.WriteByte(',')
		}
		k, err := json.Marshal(m.key)
		if err != nil {
			return nil, fmt.Errorf("encoding key %q: %w", m.key, err)
		}
		buf.Write(k)
		buf.WriteByte(':')
		buf.Write(m.val)
	}
	buf.WriteByte('}')
	var out bytes.Buffer
	if err := json.Indent(&out, buf.Bytes(), "", "  "); err != nil {
		return nil, fmt.Errorf("encoding JSON: %w", err)
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// marshalArray encodes raw elements as a JSON array.
func marshalArray(elems []json.RawMessage) json.RawMessage {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, e := range elems {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(e)
	}
	buf.WriteByte(']')
	return buf.Bytes()
}
