package config_test

import (
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/agora-dispatch/agora/internal/config"
)

// sampleConfig has one field of every kind a service uses.
type sampleConfig struct {
	Timeout       time.Duration     `envconfig:"TIMEOUT" default:"30s"`
	Count         int               `envconfig:"COUNT" default:"4"`
	Debug         bool              `envconfig:"DEBUG"`
	Routes        []string          `envconfig:"ROUTES" default:"a,b"`
	URL           string            `envconfig:"NATS_URL" required:"true"`
	WorkspaceRoot string            `split_words:"true" default:"/tmp/agora"`
	Name          string            // AGORA_NAME
	Labels        map[string]string `envconfig:"labels"`
	HTTPAddr      string            `split_words:"1"`
	Secret        string            `ignored:"true"`
	Other         string            `ignored:"1"`
	internal      int
}

var errTooMany = errors.New("count above 100")

func (c sampleConfig) Validate() error {
	if c.Count > 100 {
		return errTooMany
	}
	return nil
}

// setEnv sets every variable for the test.
func setEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
}

func TestLoad(t *testing.T) {
	setEnv(t, map[string]string{
		"AGORA_TIMEOUT":        "2m",
		"AGORA_COUNT":          "16",
		"AGORA_DEBUG":          "true",
		"AGORA_ROUTES":         "x,y,z",
		"AGORA_NATS_URL":       "nats://127.0.0.1:4222",
		"AGORA_WORKSPACE_ROOT": "/srv/ws",
		"AGORA_NAME":           "worker-1",
		"AGORA_LABELS":         "team:payments,env:dev",
		"AGORA_HTTP_ADDR":      ":8080",
		"AGORA_SECRET":         "must not be read",
		"AGORA_OTHER":          "must not be read",
	})
	var c sampleConfig
	if err := config.Load(&c); err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := sampleConfig{
		Timeout: 2 * time.Minute, Count: 16, Debug: true, Routes: []string{"x", "y", "z"},
		URL: "nats://127.0.0.1:4222", WorkspaceRoot: "/srv/ws", Name: "worker-1",
		Labels: map[string]string{"team": "payments", "env": "dev"}, HTTPAddr: ":8080",
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load = %+v\nwant   %+v", c, want)
	}
}

func TestLoadDefaults(t *testing.T) {
	t.Setenv("AGORA_NATS_URL", "nats://x")
	c := sampleConfig{Name: "preset"}
	if err := config.Load(&c); err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := sampleConfig{Timeout: 30 * time.Second, Count: 4, Routes: []string{"a", "b"}, URL: "nats://x", WorkspaceRoot: "/tmp/agora", Name: "preset"}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load = %+v\nwant   %+v", c, want)
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want []string // every one appears in the one error
		not  []string // none appears
		is   error
	}{
		{
			name: "several bad values at once",
			env:  map[string]string{"AGORA_NATS_URL": "nats://x", "AGORA_TIMEOUT": "abc", "AGORA_COUNT": "x", "AGORA_DEBUG": "maybe", "AGORA_LABELS": "nocolon"},
			want: []string{"AGORA_TIMEOUT", `"abc"`, "AGORA_COUNT", `"x"`, "AGORA_DEBUG", "AGORA_LABELS"},
			not:  []string{"AGORA_NATS_URL", "AGORA_ROUTES"},
		},
		{
			name: "required missing",
			env:  map[string]string{},
			want: []string{"AGORA_NATS_URL is required"},
		},
		{
			name: "required missing and a bad value",
			env:  map[string]string{"AGORA_COUNT": "1.5"},
			want: []string{"AGORA_NATS_URL is required", "AGORA_COUNT"},
		},
		{
			name: "validate",
			env:  map[string]string{"AGORA_NATS_URL": "nats://x", "AGORA_COUNT": "101"},
			want: []string{"count above 100"},
			is:   errTooMany,
		},
		{
			name: "bare sign as a duration",
			env:  map[string]string{"AGORA_NATS_URL": "nats://x", "AGORA_TIMEOUT": "-"},
			want: []string{"AGORA_TIMEOUT"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			var c sampleConfig
			err := config.Load(&c)
			if err == nil {
				t.Fatal("Load: nil error")
			}
			if !strings.HasPrefix(err.Error(), "config: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(err.Error(), n) {
					t.Errorf("error %q mentions %s, whose value is fine", err, n)
				}
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %q does not wrap %v", err, tt.is)
			}
		})
	}
}

// Every problem is one line of one error, each naming its variable.
func TestLoadOneLinePerProblem(t *testing.T) {
	setEnv(t, map[string]string{"AGORA_TIMEOUT": "abc", "AGORA_COUNT": "x"})
	var c sampleConfig
	err := config.Load(&c)
	if err == nil {
		t.Fatal("Load: nil error")
	}
	lines := strings.Split(strings.TrimPrefix(err.Error(), "config: "), "\n")
	if len(lines) != 3 {
		t.Fatalf("error has %d lines, want 3 (timeout, count, nats url):\n%v", len(lines), err)
	}
	for i, v := range []string{"AGORA_TIMEOUT", "AGORA_COUNT", "AGORA_NATS_URL"} {
		if !strings.HasPrefix(lines[i], v) {
			t.Errorf("line %d = %q, want it to start with %s", i, lines[i], v)
		}
	}
}

// Settings come from AGORA_* variables only: a tagged field never falls
// back to the unprefixed name.
func TestLoadIgnoresUnprefixedVariables(t *testing.T) {
	setEnv(t, map[string]string{"NATS_URL": "nats://elsewhere", "COUNT": "77", "TIMEOUT": "abc"})
	var c sampleConfig
	err := config.Load(&c)
	if err == nil || !strings.Contains(err.Error(), "AGORA_NATS_URL is required") {
		t.Errorf("Load error = %v, want AGORA_NATS_URL is required", err)
	}
	if c.URL != "" || c.Count == 77 {
		t.Errorf("Load read unprefixed variables: %+v", c)
	}
}

func TestLoadNeedsStructPointer(t *testing.T) {
	for _, spec := range []any{sampleConfig{}, new(int), nil, new(*sampleConfig)} {
		if err := config.Load(spec); err == nil {
			t.Errorf("Load(%T): nil error", spec)
		}
	}
}

func TestVar(t *testing.T) {
	tests := []struct {
		field, want string
	}{
		{"Timeout", "AGORA_TIMEOUT"},
		{"URL", "AGORA_NATS_URL"},
		{"WorkspaceRoot", "AGORA_WORKSPACE_ROOT"},
		{"Name", "AGORA_NAME"},
		{"Labels", "AGORA_LABELS"},
		{"HTTPAddr", "AGORA_HTTP_ADDR"},
		{"Missing", ""},
	}
	for _, tt := range tests {
		if got := config.Var(sampleConfig{}, tt.field); got != tt.want {
			t.Errorf("Var(%s) = %q, want %q", tt.field, got, tt.want)
		}
		if got := config.Var(&sampleConfig{}, tt.field); got != tt.want {
			t.Errorf("Var(&, %s) = %q, want %q", tt.field, got, tt.want)
		}
	}
}

// Var names exactly the variable Load reads.
func TestVarMatchesLoad(t *testing.T) {
	for _, f := range []string{"Timeout", "Count", "URL", "WorkspaceRoot", "Name", "HTTPAddr"} {
		t.Run(f, func(t *testing.T) {
			t.Setenv("AGORA_NATS_URL", "nats://x")
			t.Setenv(config.Var(sampleConfig{}, f), "not-a-valid-anything:\x01")
			var c sampleConfig
			err := config.Load(&c)
			got := reflect.ValueOf(c).FieldByName(f)
			if err == nil && got.Kind() == reflect.String && got.String() == "not-a-valid-anything:\x01" {
				return // read as a string
			}
			if err == nil || !strings.Contains(err.Error(), config.Var(sampleConfig{}, f)) {
				t.Errorf("setting %s had no effect: Load = %+v, %v", config.Var(sampleConfig{}, f), c, err)
			}
		})
	}
}

// Load reads the same variables as envconfig.Process with the AGORA prefix
// when every one is set.
func TestLoadMatchesEnvconfig(t *testing.T) {
	setEnv(t, map[string]string{
		"AGORA_TIMEOUT": "1h", "AGORA_COUNT": "3", "AGORA_DEBUG": "1", "AGORA_ROUTES": "r",
		"AGORA_NATS_URL": "nats://y", "AGORA_WORKSPACE_ROOT": "/w", "AGORA_NAME": "n",
		"AGORA_LABELS": "a:b", "AGORA_HTTP_ADDR": ":1",
	})
	var got, want sampleConfig
	if err := config.Load(&got); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := envconfig.Process(config.Prefix, &want); err != nil {
		t.Fatalf("envconfig: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load = %+v\nenvconfig = %+v", got, want)
	}
}

func TestList(t *testing.T) {
	for _, c := range []struct {
		in, want []string
	}{
		{nil, nil},
		{[]string{"", " "}, nil},
		{[]string{" a", "b ", "", " c d "}, []string{"a", "b", "c d"}},
	} {
		if got := config.List(c.in); !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("List(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// Defaults gives a zero config the values envconfig gives it with no
// variable set, and leaves set fields and fields without a default alone.
func TestDefaults(t *testing.T) {
	setEnv(t, map[string]string{"AGORA_NATS_URL": "nats://y"}) // required by sampleConfig
	var want sampleConfig
	if err := envconfig.Process(config.Prefix, &want); err != nil {
		t.Fatalf("envconfig: %v", err)
	}
	got := config.Defaults(sampleConfig{URL: "nats://y"})
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Defaults = %+v\nenvconfig = %+v", got, want)
	}
	if got := config.Defaults(sampleConfig{Count: 7}); got.Count != 7 || got.Timeout != 30*time.Second {
		t.Errorf("Defaults kept Count %d and set Timeout %s, want 7 and 30s", got.Count, got.Timeout)
	}
	type odd struct {
		N     int     `default:"many"`
		F     float64 `default:"0.5"`
		U     uint8   `default:"0x10"`
		Flags []bool  `default:"true"`
	}
	if got := config.Defaults(odd{}); got.N != 0 || got.F != 0.5 || got.U != 16 || got.Flags != nil {
		t.Errorf("Defaults(odd{}) = %+v, want N and Flags left zero", got)
	}
}

// shared is a part of a Config that a package declares and a service's
// Config embeds.
type shared struct {
	Bin  string `envconfig:"WORKER_BIN" default:"tool"`
	Size int    `envconfig:"SIZE"`
}

type embedding struct {
	Name string `envconfig:"NAME"`
	shared
	Exported
}

// Exported is an embedded struct of an exported type.
type Exported struct {
	Mode string `envconfig:"MODE" default:"fast"`
}

// The fields of an embedded struct are the embedding struct's own: Load
// reads them by their own tags, Defaults sets them and Var names them.
func TestEmbeddedStruct(t *testing.T) {
	setEnv(t, map[string]string{"AGORA_NAME": "n", "AGORA_WORKER_BIN": "/usr/bin/tool", "AGORA_SIZE": "3"})
	var c embedding
	if err := config.Load(&c); err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := embedding{Name: "n", shared: shared{Bin: "/usr/bin/tool", Size: 3}, Exported: Exported{Mode: "fast"}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load = %+v\nwant   %+v", c, want)
	}
	t.Setenv("AGORA_SIZE", "many")
	if err := config.Load(&embedding{}); err == nil || !strings.Contains(err.Error(), "AGORA_SIZE") {
		t.Errorf("Load with a bad embedded value = %v, want an error naming AGORA_SIZE", err)
	}
	if got := config.Defaults(embedding{}); got.Bin != "tool" || got.Mode != "fast" {
		t.Errorf("Defaults = %+v, want the embedded defaults", got)
	}
	for field, want := range map[string]string{"Bin": "AGORA_WORKER_BIN", "Mode": "AGORA_MODE"} {
		if got := config.Var(embedding{}, field); got != want {
			t.Errorf("Var(%s) = %q, want %q", field, got, want)
		}
	}
}

// tools is a setting whose variables its own type knows.
type tools struct{ got map[string]string }

func (t *tools) LoadEnv(lookup func(string) (string, bool)) error {
	v, ok := lookup("AGORA_TOOL_A_BIN")
	if !ok {
		return errors.New("AGORA_TOOL_A_BIN: required")
	}
	t.got = map[string]string{"a": v}
	return nil
}

// A field that is a config.Loader reads the environment itself; its
// error is reported among the others.
func TestLoader(t *testing.T) {
	type spec struct {
		Name  string `envconfig:"NAME"`
		Tools tools
	}
	setEnv(t, map[string]string{"AGORA_NAME": "n", "AGORA_TOOL_A_BIN": "/opt/a"})
	var c spec
	if err := config.Load(&c); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.Name != "n" || c.Tools.got["a"] != "/opt/a" {
		t.Errorf("Load = %+v", c)
	}
	os.Unsetenv("AGORA_TOOL_A_BIN")
	if err := config.Load(&spec{}); err == nil || !strings.Contains(err.Error(), "AGORA_TOOL_A_BIN: required") {
		t.Errorf("Load without the variable = %v", err)
	}
}
