// Package phase records when a short-lived process (the CNI plugin, the
// CLI) reaches each step of its work, so where a run's time goes can be read
// from its own log line instead of guessed: the plugin writes the marks
// into its decision line at log level debug.
//
// Marks cost a clock read and a store into a fixed array: they are always
// taken, and only written when asked for. Offsets are from this package's
// initialisation, so they include most of its importers' init work but not
// the runtime's start-up.
package phase

import (
	"strconv"
	"sync"
	"time"
)

// maxMarks bounds what one process records; marks beyond it are dropped.
const maxMarks = 48

var (
	start = time.Now()
	mu    sync.Mutex
	names [maxMarks]string
	at    [maxMarks]time.Duration
	n     int
)

// Mark records that the process reached the step name now. It is safe for
// concurrent use; name should be a short constant.
func Mark(name string) {
	d := time.Since(start)
	mu.Lock()
	if n < maxMarks {
		names[n], at[n] = name, d
		n++
	}
	mu.Unlock()
}

// String is the marks so far in order, as "t0=µs name=µs name=µs ...":
// t0 is when the marks start counting (Unix time in microseconds, to line
// them up with an outside clock), each name the time since t0.
func String() string {
	mu.Lock()
	defer mu.Unlock()
	b := make([]byte, 0, 16*n+24)
	b = append(b, "t0="...)
	b = strconv.AppendInt(b, start.UnixMicro(), 10)
	for i := range n {
		b = append(b, ' ')
		b = append(b, names[i]...)
		b = append(b, '=')
		b = strconv.AppendInt(b, at[i].Microseconds(), 10)
	}
	return string(b)
}
