module github.com/nftmesh/nftmesh

go 1.25.0
