package launcher_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/agora-dispatch/agora/internal/sandbox/launcher"
)

func TestStartRoundTrip(t *testing.T) {
	for _, s := range []launcher.Start{
		{Grace: 5e9, Path: "/bin/sh", Args: []string{"sh", "-c", "echo a\nb", ""}, Env: []string{"A=1", "B=x\ny", "C="}, Dir: "/w s",
			Policy: launcher.Policy{Landlock: true, ReadDirs: []string{"/usr"}, TCPConnect: []int{443}, Rlimits: map[string]uint64{"nproc": 64}}},
		{Path: "/x"},
		{Path: "/x", Args: []string{}, Env: []string{}},
	} {
		got, err := launcher.ParseStart(s.Format())
		if err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		// Empty and nil lists read back alike.
		norm := func(s launcher.Start) launcher.Start {
			if len(s.Args) == 0 {
				s.Args = nil
			}
			if len(s.Env) == 0 {
				s.Env = nil
			}
			if len(s.Policy.Rlimits) == 0 {
				s.Policy.Rlimits = nil
			}
			return s
		}
		if !reflect.DeepEqual(norm(got), norm(s)) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, s)
		}
	}
}

func TestParseStartRefusesMalformed(t *testing.T) {
	good := string(launcher.Start{Path: "/bin/true", Args: []string{"true"}, Env: []string{"A=1"}}.Format())
	for name, msg := range map[string]string{
		"empty":           "",
		"grace":           strings.Replace(good, "0", "x", 1),
		"args past end":   "0\x00/p\x00/\x009\x00a",
		"negative count":  "0\x00/p\x00/\x00-1\x000\x00",
		"trailing fields": good + "\x00extra",
		"policy":          "0\x00/p\x00/\x000\x000\x00bogus directive\n",
	} {
		if _, err := launcher.ParseStart([]byte(msg)); err == nil {
			t.Errorf("%s: %q parsed without error", name, msg)
		}
	}
}
