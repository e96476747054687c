// Package config loads a service's settings from AGORA_ environment
// variables with envconfig and reports every bad variable at once, by name.
package config

import (
	"errors"
	"fmt"
	"iter"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Prefix is the environment prefix of every Agora setting.
const Prefix = "AGORA"

// Validator is implemented by configs that check their values after loading.
type Validator interface{ Validate() error }

// Loader is implemented by a setting whose variables are not known from
// its field alone (the CLIs of the built-in runtimes, one variable each,
// named by their registry): Load and Read hand a field whose pointer is a
// Loader the environment's lookup instead of decoding one variable, and
// report its error among the others.
type Loader interface {
	LoadEnv(lookup func(string) (string, bool)) error
}

// Load fills spec, a pointer to a flat struct with envconfig tags, from
// AGORA_* variables. The fields of an embedded struct count as spec's own
// (a service's Config embedding the settings it shares with a package). Unlike a single envconfig.Process it keeps going after
// the first bad variable, so the error lists every problem, each naming its
// variable. When spec implements Validator its Validate error is joined in.
func Load(spec any) error { return load(spec, true) }

// Read is Load without Validate: for a caller that sets some fields itself
// before it checks the whole (agora dev, which runs every service).
func Read(spec any) error { return load(spec, false) }

func load(spec any, validate bool) error {
	v := reflect.ValueOf(spec)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("config: Load needs a pointer to a struct, got %T", spec)
	}
	var errs []error
	for f, fv := range fields(v.Elem()) {
		if isTrue(f.Tag.Get("ignored")) {
			continue
		}
		if l, ok := fv.Addr().Interface().(Loader); ok {
			if err := l.LoadEnv(os.LookupEnv); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		// Process one field at a time through a one-field struct, so
		// envconfig's own decoding (durations, lists, maps, defaults,
		// required) applies and one bad value does not hide the others.
		// The field is tagged with its full variable name and processed
		// without a prefix: envconfig would otherwise fall back to the
		// unprefixed name of a tagged field (NATS_URL for AGORA_NATS_URL).
		one := reflect.New(reflect.StructOf([]reflect.StructField{{Name: f.Name, Type: f.Type, Tag: oneTag(f)}}))
		one.Elem().Field(0).Set(fv)
		if err := envconfig.Process("", one.Interface()); err != nil {
			errs = append(errs, describe(f, err))
			continue
		}
		fv.Set(one.Elem().Field(0))
	}
	if val, ok := spec.(Validator); ok && validate && len(errs) == 0 {
		if err := val.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("config: %w", errors.Join(errs...))
	}
	return nil
}

// Var returns the environment variable name of a struct field, as Load
// reads it.
func Var(spec any, field string) string {
	t := reflect.TypeOf(spec)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	f, ok := t.FieldByName(field)
	if !ok {
		return ""
	}
	return varName(f)
}

// Defaults returns spec, a flat struct of the kind Load fills, with every
// zero field that has a default tag set to that default, so that a
// configuration made in code gets the defaults its variables document. It
// reads no environment variable. A field whose default does not decode
// stays zero (Load reports such a default).
func Defaults[T any](spec T) T {
	for f, fv := range fields(reflect.ValueOf(&spec).Elem()) {
		def, ok := f.Tag.Lookup("default")
		if !ok || !fv.IsZero() {
			continue
		}
		if d, ok := decode(f.Type, def); ok {
			fv.Set(d)
		}
	}
	return spec
}

// fields yields the settable settings of v, a struct: its exported fields,
// with those of an embedded struct in its place.
func fields(v reflect.Value) iter.Seq2[reflect.StructField, reflect.Value] {
	return func(yield func(reflect.StructField, reflect.Value) bool) {
		for i := 0; i < v.NumField(); i++ {
			f := v.Type().Field(i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				for ef, efv := range fields(v.Field(i)) {
					if !yield(ef, efv) {
						return
					}
				}
				continue
			}
			if f.IsExported() && !yield(f, v.Field(i)) {
				return
			}
		}
	}
}

// decode reads s as a value of type t, as envconfig decodes the kinds
// Agora's settings use.
func decode(t reflect.Type, s string) (reflect.Value, bool) {
	v := reflect.New(t).Elem()
	var err error
	switch k := t.Kind(); {
	case t == reflect.TypeFor[time.Duration]():
		var d time.Duration
		d, err = time.ParseDuration(s)
		v.SetInt(int64(d))
	case k == reflect.String:
		v.SetString(s)
	case k == reflect.Bool:
		var b bool
		b, err = strconv.ParseBool(s)
		v.SetBool(b)
	case k >= reflect.Int && k <= reflect.Int64:
		var n int64
		n, err = strconv.ParseInt(s, 0, t.Bits())
		v.SetInt(n)
	case k >= reflect.Uint && k <= reflect.Uint64:
		var n uint64
		n, err = strconv.ParseUint(s, 0, t.Bits())
		v.SetUint(n)
	case k == reflect.Float32 || k == reflect.Float64:
		var n float64
		n, err = strconv.ParseFloat(s, t.Bits())
		v.SetFloat(n)
	case k == reflect.Slice && t.Elem().Kind() == reflect.String:
		v.Set(reflect.ValueOf(strings.Split(s, ",")).Convert(t))
	default:
		return v, false
	}
	return v, err == nil
}

// List returns the entries of a list setting (a comma-separated
// variable) with surrounding spaces trimmed and empty entries dropped;
// nil when none is left.
func List(in []string) []string {
	var out []string
	for _, e := range in {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// varName names f's variable as envconfig does under Prefix: the
// envconfig tag, else the field name, split into words when split_words is
// true, upper-cased.
func varName(f reflect.StructField) string {
	key := f.Tag.Get("envconfig")
	if key == "" {
		key = f.Name
		if isTrue(f.Tag.Get("split_words")) {
			var words []string
			for _, w := range wordRE.FindAllString(f.Name, -1) {
				if m := acronymRE.FindStringSubmatch(w); len(m) == 3 {
					words = append(words, m[1], m[2])
				} else {
					words = append(words, w)
				}
			}
			key = strings.Join(words, "_")
		}
	}
	return strings.ToUpper(Prefix + "_" + key)
}

// The word splitting of envconfig's split_words.
var (
	wordRE    = regexp.MustCompile("([^A-Z]+|[A-Z]+[^A-Z]+|[A-Z]+)")
	acronymRE = regexp.MustCompile("([A-Z]+)([A-Z][^A-Z]+)")
)

// isTrue reads a boolean tag as envconfig does.
func isTrue(s string) bool {
	b, _ := strconv.ParseBool(s)
	return b
}

// oneTag is f's tag for the one-field struct Load hands envconfig: the full
// variable name plus the default and required settings.
func oneTag(f reflect.StructField) reflect.StructTag {
	tag := `envconfig:` + strconv.Quote(varName(f))
	for _, k := range []string{"default", "required"} {
		if v, ok := f.Tag.Lookup(k); ok {
			tag += ` ` + k + `:` + strconv.Quote(v)
		}
	}
	return reflect.StructTag(tag)
}

func describe(f reflect.StructField, err error) error {
	var pe *envconfig.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s=%q: not a valid %s", varName(f), pe.Value, typeWords(pe.TypeName))
	}
	if strings.Contains(err.Error(), "required") {
		return fmt.Errorf("%s is required", varName(f))
	}
	return fmt.Errorf("%s: %v", varName(f), err)
}

// typeWords names a setting's type as its documentation would.
func typeWords(t string) string {
	switch t {
	case "time.Duration":
		return "duration (as 30s, 5m or 1h30m)"
	case "int", "int64", "int32", "uint", "uint64", "uint32":
		return "whole number"
	case "bool":
		return "boolean (true or false)"
	case "float64", "float32":
		return "number"
	}
	return t
}
