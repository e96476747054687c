package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrNotCanonical reports a value the canonical encoding cannot hold: a
// number that is not an integer, or a string that is not UTF-8.
var ErrNotCanonical = errors.New("audit: not canonically encodable")

// Canonical returns the canonical encoding of a JSON value decoded with
// json.Decoder.UseNumber (map[string]any, []any, string, json.Number,
// bool, nil): object keys sorted by code point, no whitespace, strings
// with only '"', '\\' and the control characters below U+0020 escaped
// (\b \t \n \f \r by name, the others as \u00xx), everything else as raw
// UTF-8, integers in decimal. It is byte for byte what Python's
// json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
// writes for the same value (docs/audit.md, "Canonical encoding").
func Canonical(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := canon(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func canon(b *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case json.Number:
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return fmt.Errorf("%w: number %s is not a 64-bit integer", ErrNotCanonical, v)
		}
		b.WriteString(strconv.FormatInt(n, 10))
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case int:
		b.WriteString(strconv.Itoa(v))
	case string:
		return canonString(b, v)
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := canon(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		// UTF-8 byte order is code point order, which Python sorts by.
		slices.Sort(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := canonString(b, k); err != nil {
				return err
			}
			b.WriteByte(':')
			if err := canon(b, v[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("%w: %T", ErrNotCanonical, v)
	}
	return nil
}

func canonString(b *bytes.Buffer, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: string is not UTF-8", ErrNotCanonical)
	}
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return nil
}

// decodeObject decodes one JSON object keeping numbers exact.
func decodeObject(line []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(line))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("not a JSON object")
	}
	if d.More() {
		return nil, errors.New("more than one JSON value on the line")
	}
	return m, nil
}

// HashObject is the hash of an entry given as its decoded JSON object:
// the lowercase hex SHA-256 of the canonical encoding of the object
// without its "hash" member.
func HashObject(obj map[string]any) (string, error) {
	cp := make(map[string]any, len(obj))
	for k, v := range obj {
		if k != "hash" {
			cp[k] = v
		}
	}
	c, err := Canonical(cp)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

// Digest is "sha256:" and the lowercase hex SHA-256 of b: how entries
// name content they do not carry.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// clean makes s valid UTF-8, replacing invalid bytes with U+FFFD, so
// every string an entry carries is canonically encodable.
func clean(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
