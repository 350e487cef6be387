package redirect

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// readAnnotations are the annotation keys nftmesh reads from a pod: the
// capture annotations and those deciding whether the pod is in the mesh.
var readAnnotations = slices.Concat(CaptureAnnotations, []string{AnnotationSidecarStatus, AnnotationInject})

// maxSuggestDistance is how many single-character edits (case aside) a key
// may be away from a known one to be taken for a misspelling of it.
const maxSuggestDistance = 3

// SuggestAnnotation returns the known annotation key of which key is a
// likely misspelling (case aside), or "" (also for the exact key).
func SuggestAnnotation(key string) string {
	lk := strings.ToLower(key)
	best, bestD := "", maxSuggestDistance+1
	for _, k := range readAnnotations {
		if k == key {
			return ""
		}
		if d := boundedDistance(lk, strings.ToLower(k), bestD); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// UnknownAnnotationWarnings warns about the pod's annotations that look like
// capture settings but are not read (Istio ignores them too): any unknown
// traffic.sidecar.istio.io key, and any other *.istio.io key within a few
// edits of a known one. Sorted by key; keys and suggestions bounded.
func UnknownAnnotationWarnings(annotations map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		prefix, _, ok := strings.Cut(k, "/")
		if !ok || !(prefix == "istio.io" || strings.HasSuffix(prefix, ".istio.io")) || slices.Contains(readAnnotations, k) {
			continue
		}
		s := SuggestAnnotation(k)
		switch {
		case s != "":
			out = append(out, fmt.Sprintf("annotation %s is not read (ignored, as Istio does): did you mean %q?", quote.Value(k), s))
		case prefix == "traffic.sidecar.istio.io":
			out = append(out, fmt.Sprintf("annotation %s is not read (ignored, as Istio does); the traffic.sidecar.istio.io ones are: %s", quote.Value(k), strings.Join(trafficAnnotations(), ", ")))
		}
	}
	return out
}

func trafficAnnotations() []string {
	var out []string
	for _, k := range CaptureAnnotations {
		if name, ok := strings.CutPrefix(k, "traffic.sidecar.istio.io/"); ok {
			out = append(out, name)
		}
	}
	return out
}

// boundedDistance is the Levenshtein distance of a and b (bytes), or limit
// when it is limit or more: rows stop early once every entry reaches the
// limit, so a huge key costs O(len(b)·limit)-ish, not O(len(a)·len(b)).
func boundedDistance(a, b string, limit int) int {
	if d := len(a) - len(b); d >= limit || -d >= limit {
		return limit
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			rowMin = min(rowMin, cur[j])
		}
		if rowMin >= limit {
			return limit
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], limit)
}
