package redirect

import (
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
		"+ chain nat PREROUTING { type nat hook prerouting priority -100 policy drop }",
		"- chain nat PREROUTING { type nat hook prerouting priority -100 }",
	}
	if d := Diff(p, q); !slices.Equal(d, want) {
		t.Errorf("Diff = %q\nwant %q", d, want)
	}
	if s := TableFlags(0x18).String(); s != "0x18" {
		t.Errorf("unknown flags print as %q", s)
	}
}
