// Package logging builds the slog logger every Agora program uses: text on
// a terminal, JSON otherwise (containers, files), level from AGORA_LOG_LEVEL.
package logging

import (
	"io"
	"log/slog"
	"os"
	"strings"
)

// New returns a logger writing to w: a text handler when w is a terminal,
// JSON otherwise. AGORA_LOG_LEVEL (debug, info, warn, error) sets the level;
// AGORA_LOG_FORMAT (text, json) overrides the choice of handler.
func New(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(strings.ToUpper(os.Getenv("AGORA_LOG_LEVEL"))))
	opts := &slog.HandlerOptions{Level: level}
	format := os.Getenv("AGORA_LOG_FORMAT")
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok && isTerminal(f) {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
