package phase

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestMarksInOrder(t *testing.T) {
	reset()
	Mark("a")
	Mark("b")
	got := String()
	parts := strings.Fields(got)
	if len(parts) != 2 || !strings.HasPrefix(parts[0], "a=") || !strings.HasPrefix(parts[1], "b=") {
		t.Fatalf("String() = %q, want a=N b=M", got)
	}
	a, _ := strconv.Atoi(strings.TrimPrefix(parts[0], "a="))
	b, _ := strconv.Atoi(strings.TrimPrefix(parts[1], "b="))
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
	if got := len(strings.Fields(String())); got != maxMarks {
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
