package phase

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// reset forgets every mark.
func reset() {
	mu.Lock()
	n = 0
	mu.Unlock()
}

func TestMarksInOrder(t *testing.T) {
	reset()
	Mark("a")
	Mark("b")
	got := String()
	parts := strings.Fields(got)
	if len(parts) != 3 || !strings.HasPrefix(parts[0], "t0=") || !strings.HasPrefix(parts[1], "a=") || !strings.HasPrefix(parts[2], "b=") {
		t.Fatalf("String() = %q, want t0=T a=N b=M", got)
	}
	if t0, _ := strconv.ParseInt(strings.TrimPrefix(parts[0], "t0="), 10, 64); t0 != start.UnixMicro() {
		t.Fatalf("t0 %d, want the start %d", t0, start.UnixMicro())
	}
	a, _ := strconv.Atoi(strings.TrimPrefix(parts[1], "a="))
	b, _ := strconv.Atoi(strings.TrimPrefix(parts[2], "b="))
	if a < 0 || b < a {
		t.Fatalf("offsets not monotonic: %q", got)
	}
}

func TestBoundedAndConcurrent(t *testing.T) {
	reset()
	var wg sync.WaitGroup
	for i := range 4 * maxMarks {
		wg.Add(1)
		go func() { defer wg.Done(); Mark(fmt.Sprint("m", i)) }()
	}
	wg.Wait()
	if got := len(strings.Fields(String())) - 1; got != maxMarks {
		t.Fatalf("%d marks kept, want the bound %d", got, maxMarks)
	}
}

func BenchmarkMark(b *testing.B) {
	for range b.N {
		if n >= maxMarks {
			reset()
		}
		Mark("x")
	}
}
