package agentsock

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// encodeAnswer is a as one frame of at most max bytes. It writes the very
// bytes encoding/json's Marshal writes for an Answer (the same field
// order, omissions, sorted map keys and escaping), by hand: the agent
// answers a pod start now and then, so each answer runs on cold caches,
// where encoding/json's reflective walk costs several times this code.
func encodeAnswer(a Answer, max int) ([]byte, error) {
	b := make([]byte, 4, 1024)
	b = appendAnswer(b, a)
	if n := len(b) - 4; n > max {
		return nil, fmt.Errorf("frame of %d bytes is over the %d-byte limit", n, max)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b, nil
}

func appendAnswer(b []byte, a Answer) []byte {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(a.V), 10)
	b = append(b, `,"status":`...)
	b = appendString(b, a.Status)
	if a.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, a.Reason)
	}
	if a.UID != "" {
		b = append(b, `,"uid":`...)
		b = appendString(b, a.UID)
	}
	if a.Pod != nil {
		b = append(b, `,"pod":`...)
		b = appendPod(b, a.Pod)
	}
	return append(b, '}')
}

func appendPod(b []byte, p *meshpod.Pod) []byte {
	b = append(b, `{"Namespace":`...)
	b = appendString(b, p.Namespace)
	b = append(b, `,"Name":`...)
	b = appendString(b, p.Name)
	b = append(b, `,"Labels":`...)
	b = appendStringMap(b, p.Labels)
	b = append(b, `,"Annotations":`...)
	b = appendStringMap(b, p.Annotations)
	b = append(b, `,"InitContainers":`...)
	b = appendContainers(b, p.InitContainers)
	b = append(b, `,"Containers":`...)
	b = appendContainers(b, p.Containers)
	b = append(b, `,"PodIPs":`...)
	b = appendStrings(b, p.PodIPs)
	return append(b, '}')
}

func appendContainers(b []byte, cs []meshpod.Container) []byte {
	if cs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, c := range cs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"Name":`...)
		b = appendString(b, c.Name)
		b = append(b, `,"Args":`...)
		b = appendStrings(b, c.Args)
		b = append(b, `,"Env":`...)
		if c.Env == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, '[')
			for j, e := range c.Env {
				if j > 0 {
					b = append(b, ',')
				}
				b = append(b, `{"Name":`...)
				b = appendString(b, e.Name)
				b = append(b, `,"Value":`...)
				b = appendString(b, e.Value)
				b = append(b, '}')
			}
			b = append(b, ']')
		}
		b = append(b, `,"RunAsUser":`...)
		b = appendOptInt(b, c.RunAsUser)
		b = append(b, `,"RunAsGroup":`...)
		b = appendOptInt(b, c.RunAsGroup)
		b = append(b, '}')
	}
	return append(b, ']')
}

func appendOptInt(b []byte, v *int64) []byte {
	if v == nil {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, *v, 10)
}

func appendStrings(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

// appendStringMap writes m with its keys sorted, as encoding/json does.
func appendStringMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, m[k])
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendString writes s as encoding/json does by default: the two-byte
// escapes for '"', '\\', '\b', '\f', '\n', '\r' and '\t', \u00XX for the
// other control bytes and for '<', '>' and '&' (HTML-safe), \u2028 and
// \u2029 (JavaScript-safe), and U+FFFD for each invalid UTF-8 byte.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += n
			continue
		}
		i += n
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
