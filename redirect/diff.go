package redirect

// Diff compares two Plans in canonical form and returns the differing lines
// ("-" only in want, "+" only in got), or nil when they are equivalent.
// Sets compare by content (address sets as merged intervals, port sets as
// sorted ports), so a backend may store them in its own order.
func Diff(want, got Plan) []string {
	a, b := Describe(want), Describe(got)
	var out []string
	// Where a line was both removed and added, the added one is listed
	// first.
	for _, st := range Align(len(a), len(b), func(i, j int) bool { return a[i] == b[j] }, false) {
		switch {
		case st.A < 0:
			out = append(out, "+ "+b[st.B])
		case st.B < 0:
			out = append(out, "- "+a[st.A])
		}
	}
	return out
}

// Step is one step of an alignment of two sequences a and b: A and B index
// an element common to both, or one of them is -1 for an element only in
// the other.
type Step struct{ A, B int }

// Align lines up sequences of lengths n and m on a longest common
// subsequence (same(i, j) tells whether a[i] and b[j] are equal) and returns
// the steps in order. Between two common elements, the elements only in a
// come before those only in b when aFirst, after them otherwise. Quadratic
// in time and memory: for plans, which are at most a few hundred lines.
func Align(n, m int, same func(i, j int) bool, aFirst bool) []Step {
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if same(i, j) {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	out := make([]Step, 0, max(n, m))
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && same(i, j):
			out = append(out, Step{i, j})
			i, j = i+1, j+1
		case j == m || i < n && (lcs[i+1][j] > lcs[i][j+1] || aFirst && lcs[i+1][j] == lcs[i][j+1]):
			out = append(out, Step{i, -1})
			i++
		default:
			out = append(out, Step{-1, j})
			j++
		}
	}
	return out
}
