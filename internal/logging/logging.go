// Package logging builds the slog logger every Agora program uses: text on
// a terminal, JSON otherwise (containers, files), level from AGORA_LOG_LEVEL.
// Durations are logged in one form ("1.5s", never nanoseconds), and a
// dispatch's trace id goes on its log lines (Trace).
package logging

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"
)

// New returns a logger writing to w: a text handler when w is a terminal,
// JSON otherwise. AGORA_LOG_LEVEL (debug, info, warn, error; default info)
// sets the level; AGORA_LOG_FORMAT (text, json) overrides the choice of
// handler. A value outside those is an error naming the variable, and the
// program stops at start rather than log in a way nobody asked for.
func New(w io.Writer) (*slog.Logger, error) {
	level, format, err := settings()
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: replaceAttr}
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok && isTerminal(f) {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return slog.New(slog.NewJSONHandler(w, opts)), nil
}

// settings reads and checks AGORA_LOG_LEVEL and AGORA_LOG_FORMAT.
func settings() (slog.Level, string, error) {
	var errs []error
	var level slog.Level
	switch v := strings.ToLower(strings.TrimSpace(os.Getenv("AGORA_LOG_LEVEL"))); v {
	case "", "info":
		level = slog.LevelInfo
	case "debug":
		level = slog.LevelDebug
	case "warn", "warning":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		errs = append(errs, fmt.Errorf("AGORA_LOG_LEVEL=%q: want debug, info, warn or error", os.Getenv("AGORA_LOG_LEVEL")))
	}
	format := strings.ToLower(strings.TrimSpace(os.Getenv("AGORA_LOG_FORMAT")))
	switch format {
	case "", "text", "json":
	default:
		errs = append(errs, fmt.Errorf("AGORA_LOG_FORMAT=%q: want text or json", os.Getenv("AGORA_LOG_FORMAT")))
	}
	return level, format, errors.Join(errs...)
}

// replaceAttr writes every duration as its String ("250ms", "30s"): the
// JSON handler would write nanoseconds, so the same setting read two ways.
func replaceAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	if a.Value.Kind() == slog.KindAny {
		if d, ok := a.Value.Any().(time.Duration); ok {
			return slog.String(a.Key, d.String())
		}
	}
	return a
}

// Trace returns the attributes that put a W3C traceparent's trace and span
// ids on log lines ("trace_id", "span_id"), for use with Logger.With; none
// for a value that is not a valid version-00 traceparent (lower-case hex,
// ids not all zero), so nothing a client sent unchecked reaches a line.
func Trace(traceparent string) []any {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || parts[0] != "00" || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 ||
		!lowerHex(traceparent) || strings.Trim(parts[1], "0") == "" || strings.Trim(parts[2], "0") == "" {
		return nil
	}
	return []any{"trace_id", parts[1], "span_id", parts[2]}
}

// lowerHex reports whether s holds only lower-case hex digits and dashes.
func lowerHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') && c != '-' {
			return false
		}
	}
	return true
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
