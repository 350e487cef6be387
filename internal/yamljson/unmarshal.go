package yamljson

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Unmarshal decodes one YAML document into v as sigs.k8s.io/yaml's
// Unmarshal does: it converts the YAML to JSON guided by v's type, so that
// a number or boolean bound for a string field (an unquoted
// `sidecar.istio.io/inject: true` for a map[string]string) becomes its
// text, then decodes that JSON with encoding/json (field names matched
// case-insensitively, unknown ones ignored).
//
// The guide follows struct fields by their json names, maps, slices and
// pointers; a type that decodes itself (json.Unmarshaler,
// encoding.TextUnmarshaler) is not guided into. Structs with embedded
// fields are refused: their guidance depends on encoding/json's field
// promotion rules, which this package does not reproduce.
func Unmarshal(y []byte, v any) error {
	tree, err := Decode(y)
	if err != nil {
		return fmt.Errorf("converting YAML to JSON: %w", err)
	}
	if tree, err = guide(tree, reflect.TypeOf(v)); err != nil {
		return err
	}
	j, err := marshal(tree, y)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(j, v); err != nil {
		return fmt.Errorf("decoding JSON: %w", err)
	}
	return nil
}

// target resolves t to what a value is decoded into: through pointers,
// and nil for a type that decodes itself or for an interface.
func target(t reflect.Type) reflect.Type {
	jsonUnmarshaler := reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler := reflect.TypeFor[encoding.TextUnmarshaler]()
	for t != nil {
		if t.Implements(jsonUnmarshaler) || t.Implements(textUnmarshaler) ||
			t.Kind() != reflect.Pointer && (reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler)) {
			return nil
		}
		switch t.Kind() {
		case reflect.Pointer:
			t = t.Elem()
		case reflect.Interface:
			return nil
		default:
			return t
		}
	}
	return nil
}

// guide turns numbers and booleans bound for string-kinded targets into
// their text, as sigs.k8s.io/yaml does: integers in decimal, floats as
// strconv formats a float32 in 'g' form, booleans as true or false.
func guide(v any, t reflect.Type) (any, error) {
	t = target(t)
	if t == nil {
		return v, nil
	}
	switch v := v.(type) {
	case map[string]any:
		switch t.Kind() {
		case reflect.Map:
			for k, e := range v {
				g, err := guide(e, t.Elem())
				if err != nil {
					return nil, err
				}
				v[k] = g
			}
		case reflect.Struct:
			for i := range t.NumField() {
				if t.Field(i).Anonymous {
					return nil, fmt.Errorf("decoding YAML into %s: embedded struct fields are not supported", t)
				}
			}
			for k, e := range v {
				f, ok := field(t, k)
				if !ok {
					continue
				}
				g, err := guide(e, f.Type)
				if err != nil {
					return nil, err
				}
				v[k] = g
			}
		}
		return v, nil
	case []any:
		if t.Kind() == reflect.Slice {
			for i, e := range v {
				g, err := guide(e, t.Elem())
				if err != nil {
					return nil, err
				}
				v[i] = g
			}
		}
		return v, nil
	}
	if t.Kind() != reflect.String {
		return v, nil
	}
	switch v := v.(type) {
	case int64:
		return strconv.FormatInt(v, 10), nil
	case uint64:
		return strconv.FormatUint(v, 10), nil
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 32), nil
	case bool:
		return strconv.FormatBool(v), nil
	}
	return v, nil
}

// field finds the field encoding/json would fill from key: the one whose
// name is key exactly, else the first whose name equals it under Unicode
// case folding.
func field(t reflect.Type, key string) (reflect.StructField, bool) {
	var fold reflect.StructField
	found := false
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name := f.Name
		if tag, ok := f.Tag.Lookup("json"); ok {
			n, _, _ := strings.Cut(tag, ",")
			if n == "-" && !strings.Contains(tag, ",") {
				continue
			}
			if n != "" {
				name = n
			}
		}
		if name == key {
			return f, true
		}
		if !found && bytes.EqualFold([]byte(name), []byte(key)) {
			fold, found = f, true
		}
	}
	return fold, found
}
