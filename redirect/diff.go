package redirect

// Diff compares two Plans in canonical form and returns the differing lines
// ("-" only in want, "+" only in got), or nil when they are equivalent.
// Sets compare by content (as merged intervals), so a backend may store
// them in its own order.
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
// come before those only in b when aFirst, after them otherwise.
//
// The common head and tail are matched first, in linear time: plans that
// differ in a few lines (drift, the two families' rules of one chain) are
// aligned whatever their length (a pod's annotations can make 45,000
// rules). Only the rest is aligned by LCS, quadratic in time and memory, and
// only up to maxAlignCells: beyond, its elements are listed as only in a,
// then only in b (or the other way round), a correct if not a shortest
// alignment, rather than gigabytes of table.
func Align(n, m int, same func(i, j int) bool, aFirst bool) []Step {
	head := 0
	for head < n && head < m && same(head, head) {
		head++
	}
	tail := 0
	for tail < n-head && tail < m-head && same(n-1-tail, m-1-tail) {
		tail++
	}
	out := make([]Step, 0, max(n, m))
	for i := range head {
		out = append(out, Step{i, i})
	}
	out = alignMiddle(out, head, n-tail, head, m-tail, same, aFirst)
	for k := tail; k > 0; k-- {
		out = append(out, Step{n - k, m - k})
	}
	return out
}

// maxAlignCells bounds the LCS table of Align (4 bytes a cell: 16 MiB).
const maxAlignCells = 1 << 22

// alignMiddle appends to out the alignment of a[a0:a1] with b[b0:b1].
func alignMiddle(out []Step, a0, a1, b0, b1 int, same func(i, j int) bool, aFirst bool) []Step {
	n, m := a1-a0, b1-b0
	if (n+1)*(m+1) > maxAlignCells {
		onlyA := func() {
			for i := a0; i < a1; i++ {
				out = append(out, Step{i, -1})
			}
		}
		onlyB := func() {
			for j := b0; j < b1; j++ {
				out = append(out, Step{-1, j})
			}
		}
		if aFirst {
			onlyA()
			onlyB()
		} else {
			onlyB()
			onlyA()
		}
		return out
	}
	lcs := make([][]int32, n+1)
	for i := range lcs {
		lcs[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if same(a0+i, b0+j) {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && same(a0+i, b0+j):
			out = append(out, Step{a0 + i, b0 + j})
			i, j = i+1, j+1
		case j == m || i < n && (lcs[i+1][j] > lcs[i][j+1] || aFirst && lcs[i+1][j] == lcs[i][j+1]):
			out = append(out, Step{a0 + i, -1})
			i++
		default:
			out = append(out, Step{-1, b0 + j})
			j++
		}
	}
	return out
}
