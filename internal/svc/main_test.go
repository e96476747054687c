package svc_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/agora-dispatch/agora/internal/svc"
)

// mainConfig is a service's settings as Main loads them.
type mainConfig struct {
	Name string `envconfig:"SVC_TEST_NAME" required:"true"`
}

// reloading is a Runner with a Reload.
type reloading struct {
	svc.RunFunc
	reloaded chan struct{}
}

func (r reloading) Reload() error { r.reloaded <- struct{}{}; return nil }

func TestMainExitCodes(t *testing.T) {
	t.Setenv("AGORA_LOG_LEVEL", "error")
	for _, tc := range []struct {
		name  string
		env   string // AGORA_SVC_TEST_NAME; empty: unset
		build func(cfg mainConfig) (svc.Runner, error)
		want  int
	}{
		{"runs and ends cleanly", "a", func(cfg mainConfig) (svc.Runner, error) {
			return svc.RunFunc(func(context.Context) error {
				if cfg.Name != "a" {
					return errors.New("settings not loaded: " + cfg.Name)
				}
				return nil
			}), nil
		}, 0},
		{"a bad setting stops it before build", "", func(mainConfig) (svc.Runner, error) {
			return nil, errors.New("built without its settings")
		}, 1},
		{"a build error", "a", func(mainConfig) (svc.Runner, error) { return nil, errors.New("no") }, 1},
		{"a run error", "a", func(mainConfig) (svc.Runner, error) {
			return svc.RunFunc(func(context.Context) error { return errors.New("broke") }), nil
		}, 1},
		{"an exit code", "a", func(mainConfig) (svc.Runner, error) {
			return svc.RunFunc(func(context.Context) error { return svc.Exit(3) }), nil
		}, 3},
		{"SIGHUP calls Reload", "a", func(mainConfig) (svc.Runner, error) {
			r := reloading{reloaded: make(chan struct{}, 1)}
			r.RunFunc = func(context.Context) error {
				if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
					return err
				}
				select {
				case <-r.reloaded:
					return nil
				case <-time.After(10 * time.Second):
					return errors.New("not reloaded on SIGHUP")
				}
			}
			return r, nil
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("AGORA_SVC_TEST_NAME", tc.env)
			}
			got := svc.Main("svc-test", func(_ context.Context, cfg mainConfig, _ *slog.Logger) (svc.Runner, error) {
				return tc.build(cfg)
			})
			if got != tc.want {
				t.Errorf("Main = %d, want %d", got, tc.want)
			}
		})
	}
}
