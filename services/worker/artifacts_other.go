//go:build !unix

package worker

// oNoFollow: the walk already skips symlinks and FIFOs on these platforms.
const oNoFollow = 0
