package bench

import (
	"fmt"
	"io"
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
