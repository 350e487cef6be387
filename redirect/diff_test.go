package redirect

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestAlign: common elements pair up on a longest common subsequence, and
// between two of them the side aFirst names comes first.
func TestAlign(t *testing.T) {
	render := func(a, b string, steps []Step) string {
		var sb strings.Builder
		for _, st := range steps {
			switch {
			case st.A >= 0 && st.B >= 0:
				sb.WriteString("=" + string(a[st.A]))
			case st.A >= 0:
				sb.WriteString("-" + string(a[st.A]))
			default:
				sb.WriteString("+" + string(b[st.B]))
			}
		}
		return sb.String()
	}
	for _, tt := range []struct {
		a, b   string
		aFirst bool
		want   string
	}{
		{"", "", false, ""},
		{"abc", "abc", false, "=a=b=c"},
		{"abc", "", true, "-a-b-c"},
		{"", "xy", true, "+x+y"},
		{"axc", "ayc", false, "=a+y-x=c"},
		{"axc", "ayc", true, "=a-x+y=c"},
		{"abcd", "acbd", false, "=a+c=b-c=d"},
		{"xab", "abx", true, "-x=a=b+x"},
	} {
		a, b := tt.a, tt.b
		got := render(a, b, Align(len(a), len(b), func(i, j int) bool { return a[i] == b[j] }, tt.aFirst))
		if got != tt.want {
			t.Errorf("Align(%q, %q, aFirst=%t) = %s, want %s", a, b, tt.aFirst, got, tt.want)
		}
	}
}

// TestDiffListsOnlyDifferences: equal plans give nil; a changed rule shows
// as its two lines, added first.
func TestDiffListsOnlyDifferences(t *testing.T) {
	p, err := Build(DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(p, p); d != nil {
		t.Fatalf("Diff of a plan with itself: %q", d)
	}
	q, err := Build(DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	c := q.Table(TableNat).Chain(ChainRedirect)
	c.Rules[0].Verdict = Redirect{Port: 15099}
	d := Diff(p, q)
	if len(d) != 2 || !strings.HasPrefix(d[0], "+ ") || !strings.HasPrefix(d[1], "- ") || !slices.ContainsFunc(d, func(l string) bool { return strings.Contains(l, "15099") }) {
		t.Fatalf("Diff after changing one rule: %q", d)
	}
}

// TestDiffNamesTableFlagsAndPolicy: a table switched off and a base chain
// that drops what falls through are differences, each named in its line.
func TestDiffNamesTableFlagsAndPolicy(t *testing.T) {
	p, err := Build(DefaultSpec())
	if err != nil {
		t.Fatal(err)
	}
	q := p.Clone()
	q.TableFlags = TableDormant | TableOwner
	q.Table(TableNat).Chain(ChainPrerouting).Policy = PolicyDrop
	want := []string{
		"+ table flags dormant,owner",
		"+ chain nat-prerouting { type nat hook prerouting priority -100 policy drop }",
		"- chain nat-prerouting { type nat hook prerouting priority -100 }",
	}
	if d := Diff(p, q); !slices.Equal(d, want) {
		t.Errorf("Diff = %q\nwant %q", d, want)
	}
	if s := TableFlags(0x18).String(); s != "0x18" {
		t.Errorf("unknown flags print as %q", s)
	}
}

// TestAlignLongSequences: long sequences that differ in a few elements
// align in linear memory (their common head and tail first), and ones that
// differ throughout are not given a quadratic table beyond maxAlignCells;
// either way the steps are a valid alignment. The whole LCS table took
// 8 bytes a cell: CHECK of a pod with 44,000 excluded interfaces asked for
// gigabytes.
func TestAlignLongSequences(t *testing.T) {
	const n = 4000
	seq := func(prefix string, from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, fmt.Sprintf("%s%d", prefix, i))
		}
		return out
	}
	oneChanged := seq("r", 0, n)
	oneChanged[n/2] = "changed"
	for _, tc := range []struct {
		name string
		a, b []string
		same int // elements aligned as common
	}{
		{"one element changed", seq("r", 0, n), oneChanged, n - 1},
		{"different throughout", seq("a", 0, n), seq("b", 0, n), 0},
		{"different middle", slices.Concat(seq("r", 0, 10), seq("a", 0, n), seq("r", 10, 20)), slices.Concat(seq("r", 0, 10), seq("b", 0, n), seq("r", 10, 20)), 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.a, tc.b
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			steps := Align(len(a), len(b), func(i, j int) bool { return a[i] == b[j] }, false)
			runtime.ReadMemStats(&after)
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
				t.Errorf("Align of %d and %d elements allocated %d MiB", len(a), len(b), alloc>>20)
			}
			nextA, nextB, common := 0, 0, 0
			for _, st := range steps {
				if st.A >= 0 {
					if st.A != nextA {
						t.Fatalf("step %+v: a out of order (want %d)", st, nextA)
					}
					nextA++
				}
				if st.B >= 0 {
					if st.B != nextB {
						t.Fatalf("step %+v: b out of order (want %d)", st, nextB)
					}
					nextB++
				}
				if st.A >= 0 && st.B >= 0 {
					if a[st.A] != b[st.B] {
						t.Fatalf("step %+v aligns %q with %q", st, a[st.A], b[st.B])
					}
					common++
				}
			}
			if nextA != len(a) || nextB != len(b) || common != tc.same {
				t.Errorf("steps cover %d of %d and %d of %d, %d common; want all, %d common", nextA, len(a), nextB, len(b), common, tc.same)
			}
		})
	}
}
