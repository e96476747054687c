package sentinel

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// utf8BOM is stripped from the start of a sentinel file; some editors and
// Windows tools write one.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// kindReason is the reason given for a kind outside the four.
const kindReason = "must be one of clarification, decision, information, approval"

// Parse applies the sentinel content rules to b, the bytes of a sentinel
// file, and returns the normalised [Request]. It does not check the size
// limit, which is a property of the file (see [Resolve]).
//
// A leading UTF-8 byte order mark is ignored. b must hold exactly one JSON
// object. question is required: a string that is not blank. options, when
// present and not null, is an array of non-blank strings; an empty array
// means no options and is returned as nil. context is a string. kind is one
// of the four [Kind] values. partial_state is any JSON value, kept byte for
// byte; null means absent. dedupe_key is a string of printable text of at
// most [MaxDedupeKey] bytes; reuse is true or false. Arrays and objects nest
// at most [MaxDepth] levels, the top object counted. A JSON null context or kind is also treated as
// absent. Field names are case-sensitive, unknown fields are ignored and,
// as with encoding/json, the last of duplicate fields wins. Invalid UTF-8
// in a known field is refused rather than replaced.
//
// A non-nil error is always a *[MalformedError] naming the first field at
// fault (fields are checked in the order above), or no field when the
// problem concerns the whole file.
func Parse(b []byte) (Request, error) {
	offset := 0
	if bytes.HasPrefix(b, utf8BOM) {
		b = b[len(utf8BOM):]
		offset = len(utf8BOM)
	}
	if len(trimJSONSpace(b)) == 0 {
		return Request{}, malformed("", "empty file")
	}
	if d := depth(b); d > MaxDepth {
		return Request{}, malformed("", "nested "+strconv.Itoa(d)+" levels deep (arrays and objects, the top object counted); the limit is "+strconv.Itoa(MaxDepth)+": keep partial_state flatter, or store a deep structure as a file and name it")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var top json.RawMessage
	if err := dec.Decode(&top); err != nil {
		return Request{}, malformed("", "invalid JSON: "+syntaxReason(err, offset))
	}
	if top[0] != '{' {
		return Request{}, malformed("", "not a JSON object (got "+jsonType(top)+")")
	}
	if len(trimJSONSpace(b[dec.InputOffset():])) != 0 {
		return Request{}, malformed("", "trailing data after the JSON object")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(top, &fields); err != nil {
		// Unreachable: top is a syntactically valid object.
		return Request{}, malformed("", "invalid JSON: "+syntaxReason(err, offset))
	}
	return fromFields(fields)
}

// depth returns how deeply b's arrays and objects nest, outside strings,
// stopping once past MaxDepth: a scan of the bytes, before anything
// decodes (or anyone later renders) what a deeper file would hold.
func depth(b []byte) int {
	d, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			d++
			if d > deepest {
				deepest = d
				if deepest > MaxDepth {
					return deepest
				}
			}
		case c == ']' || c == '}':
			d--
		}
	}
	return deepest
}

// fromFields checks each known field of a decoded sentinel object.
func fromFields(fields map[string]json.RawMessage) (Request, error) {
	var r Request
	var err error
	if r.Question, err = questionField(fields); err != nil {
		return Request{}, err
	}
	if raw, ok := present(fields, "options"); ok {
		if r.Options, err = optionsField(raw); err != nil {
			return Request{}, err
		}
	}
	if raw, ok := present(fields, "context"); ok {
		if r.Context, err = decodeString("context", raw); err != nil {
			return Request{}, err
		}
	}
	if raw, ok := present(fields, "kind"); ok {
		if r.Kind, err = kindField(raw); err != nil {
			return Request{}, err
		}
	}
	if raw, ok := present(fields, "partial_state"); ok {
		if !utf8.Valid(raw) {
			return Request{}, malformed("partial_state", "invalid UTF-8")
		}
		r.PartialState = raw
	}
	if raw, ok := present(fields, "dedupe_key"); ok {
		if r.DedupeKey, err = dedupeKeyField(raw); err != nil {
			return Request{}, err
		}
	}
	if raw, ok := present(fields, "reuse"); ok {
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return Request{}, malformed("reuse", "must be true or false")
		}
		r.Reuse = &b
	}
	return r, nil
}

// present returns the field name of fields when it is there and not null.
func present(fields map[string]json.RawMessage, name string) (json.RawMessage, bool) {
	raw, ok := fields[name]
	return raw, ok && !isNull(raw)
}

// questionField checks the required question: a string, not blank.
func questionField(fields map[string]json.RawMessage) (string, error) {
	raw, ok := fields["question"]
	if !ok {
		return "", malformed("question", "required")
	}
	q, err := decodeString("question", raw)
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(q) == "" {
		return "", malformed("question", "must not be empty")
	}
	return q, nil
}

// optionsField checks options: an array of strings, none blank.
func optionsField(raw json.RawMessage) ([]string, error) {
	if raw[0] != '[' {
		return nil, malformed("options", "must be an array of strings")
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, malformed("options", "must be an array of strings")
	}
	var options []string
	for i, e := range elems {
		name := "options[" + strconv.Itoa(i) + "]"
		s, err := decodeString(name, e)
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(s) == "" {
			return nil, malformed(name, "must not be empty")
		}
		options = append(options, s)
	}
	return options, nil
}

// kindField checks kind: a string naming a valid Kind.
func kindField(raw json.RawMessage) (Kind, error) {
	s, err := decodeString("kind", raw)
	if err != nil {
		return "", err
	}
	if !Kind(s).Valid() {
		return "", malformed("kind", kindReason)
	}
	return Kind(s), nil
}

// dedupeKeyField checks dedupe_key: a string checkDedupeKey accepts.
func dedupeKeyField(raw json.RawMessage) (string, error) {
	s, err := decodeString("dedupe_key", raw)
	if err != nil {
		return "", err
	}
	if err := checkDedupeKey(s); err != nil {
		return "", err
	}
	return s, nil
}

// checkDedupeKey applies the dedupe_key rules: at most MaxDedupeKey bytes
// of UTF-8 text without control characters.
func checkDedupeKey(s string) error {
	switch {
	case !utf8.ValidString(s):
		return malformed("dedupe_key", "invalid UTF-8")
	case len(s) > MaxDedupeKey:
		return malformed("dedupe_key", "longer than "+strconv.Itoa(MaxDedupeKey)+" bytes")
	case strings.TrimSpace(s) == "":
		return malformed("dedupe_key", "must not be blank (leave it out instead)")
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return malformed("dedupe_key", "must not hold control characters")
	}
	return nil
}

// Validate reports whether r satisfies the rules [Parse] applies to a
// sentinel file, so that a request that validates can be written and read
// back. It returns nil or a *[MalformedError] naming the first field at
// fault.
//
// Unlike a file, a Request may leave Kind empty and may hold an empty
// Options slice or a JSON null PartialState; [Write] omits all three.
// PartialState, when set, must be valid JSON and valid UTF-8; whitespace
// around the value is allowed. Strings must be valid UTF-8, because JSON
// encoding would silently replace invalid bytes.
func (r Request) Validate() error {
	if !utf8.ValidString(r.Question) {
		return malformed("question", "invalid UTF-8")
	}
	if strings.TrimSpace(r.Question) == "" {
		return malformed("question", "must not be empty")
	}
	for i, o := range r.Options {
		name := "options[" + strconv.Itoa(i) + "]"
		if !utf8.ValidString(o) {
			return malformed(name, "invalid UTF-8")
		}
		if strings.TrimSpace(o) == "" {
			return malformed(name, "must not be empty")
		}
	}
	if !utf8.ValidString(r.Context) {
		return malformed("context", "invalid UTF-8")
	}
	if r.Kind != "" && !r.Kind.Valid() {
		return malformed("kind", kindReason)
	}
	if r.DedupeKey != "" {
		if err := checkDedupeKey(r.DedupeKey); err != nil {
			return err
		}
	}
	if len(r.PartialState) > 0 {
		if !utf8.Valid(r.PartialState) {
			return malformed("partial_state", "invalid UTF-8")
		}
		if !json.Valid(r.PartialState) {
			return malformed("partial_state", "must be valid JSON")
		}
		// In the file it sits one level below the top object.
		if d := depth(r.PartialState); d > MaxDepth-1 {
			return malformed("partial_state", "nested "+strconv.Itoa(d)+" levels deep; the limit is "+strconv.Itoa(MaxDepth-1)+" (the file's "+strconv.Itoa(MaxDepth)+", the top object counted): keep it flatter")
		}
	}
	return nil
}

// decodeString decodes raw, the bytes of one JSON value, as a string.
func decodeString(field string, raw json.RawMessage) (string, error) {
	if raw[0] != '"' {
		return "", malformed(field, "must be a string")
	}
	if !utf8.Valid(raw) {
		return "", malformed(field, "invalid UTF-8")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", malformed(field, "must be a string")
	}
	return s, nil
}

// malformed returns a *MalformedError as an error.
func malformed(field, reason string) error {
	return &MalformedError{Field: field, Reason: reason}
}

// isNull reports whether raw is the JSON literal null.
func isNull(raw []byte) bool {
	return string(raw) == "null"
}

// jsonType names the type of a syntactically valid JSON value.
func jsonType(raw []byte) string {
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 'n':
		return "null"
	case 't', 'f':
		return "boolean"
	}
	return "number"
}

// syntaxReason describes a JSON decoding error; offset is added to the
// position so that it counts from the start of the file.
func syntaxReason(err error, offset int) string {
	var se *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of input"
	case errors.As(err, &se):
		return se.Error() + " (offset " + strconv.FormatInt(se.Offset+int64(offset), 10) + ")"
	}
	return err.Error()
}

// trimJSONSpace removes the whitespace JSON allows around values: space,
// tab, line feed and carriage return.
func trimJSONSpace(b []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}
