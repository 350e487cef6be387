module github.com/nftmesh/nftmesh/tools/release

go 1.25.0

require golang.org/x/mod v0.30.0
