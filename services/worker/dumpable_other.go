//go:build !linux

package worker

func nonDumpable() error { return nil }
