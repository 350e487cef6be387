// Package release holds the test of nftmesh's one version: on a copy of
// the checkout, `make release` cuts a release, and for the release tag and
// for the development commit after it, the binaries `make build` links
// (nftmesh-agent --version, redirect version, the CNI plugin's --version
// and about line), the image `make image-ref` names and `make push` tags,
// and the chart (`make chart`'s package and the in-tree chart, through
// helm) all say the same version, and a development build says it is one.
//
// It has no non-test code; it needs git, make and helm (not root), and is
// skipped with -short.
package release
