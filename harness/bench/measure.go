package bench

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"time"
)

// sayer returns a printer of progress lines to w (nothing when w is nil).
func sayer(w io.Writer) func(format string, a ...any) {
	return func(format string, a ...any) {
		if w != nil {
			fmt.Fprintf(w, format+"\n", a...)
		}
	}
}

// percentileMS is the p-th percentile (0..1) of sorted durations, in
// milliseconds.
func percentileMS(sorted []time.Duration, p float64) float64 {
	return float64(sorted[int(p*float64(len(sorted)-1))].Microseconds()) / 1000
}

// medianMS runs f n times and returns the median duration in
// milliseconds, or f's first error.
func medianMS(n int, f func() error) (float64, error) {
	ds := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		ds = append(ds, time.Since(t))
	}
	slices.Sort(ds)
	return percentileMS(ds, 0.5), nil
}

// peaks measures the peak resident memory of each part of a run. The
// process holds the embedded server too.
type peaks struct{ max float64 }

// window hands freed memory back to the OS and resets the kernel's
// high-water mark (5 written to /proc/self/clear_refs), and returns a
// reader of the peak since then, in MiB (VmHWM). Where the mark cannot be
// reset, the reading is the process's peak so far. Resetting the mark
// resets getrusage's too, so the run's peak is the largest reading (all).
func (p *peaks) window() func() float64 {
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	return func() float64 {
		v := procKiB("VmHWM") / 1024
		p.max = max(p.max, v)
		return v
	}
}

// all is the largest peak read so far.
func (p *peaks) all() float64 { return p.max }
