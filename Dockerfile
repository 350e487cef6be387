# syntax=docker/dockerfile:1
# The nftmesh image: the node agent and the CNI plugin, static, on a base
# with no shell, no package manager and no iptables/nft binaries (the plugin
# programs netfilter over netlink and execs nothing).

FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY . .
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -ldflags="-s -w" -o /out/nftmesh-agent ./cmd/nftmesh-agent && \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -ldflags="-s -w" -o /out/nftmesh-cni ./cmd/nftmesh-cni

# distroless/static: CA certificates and /etc/passwd only; the agent runs as
# root (it writes the host's CNI dirs) with all capabilities dropped but
# NET_ADMIN by the chart.
FROM gcr.io/distroless/static-debian12:latest
COPY --from=build /out/nftmesh-agent /usr/local/bin/nftmesh-agent
# The agent's --plugin-binary default: the file it copies to the host.
COPY --from=build /out/nftmesh-cni /opt/cni/bin/nftmesh-cni
USER 0:0
ENTRYPOINT ["/usr/local/bin/nftmesh-agent"]
