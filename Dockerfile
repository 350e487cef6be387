# syntax=docker/dockerfile:1
# The nftmesh image for people with Docker. The reference build is
# `make image` (no Docker, no registry, reproducible; see the README): this
# file must give the same layout (binary paths, entrypoint, user), which
# tools/imagebuild's TestDockerfileMatchesTheReferenceLayout checks.
#
#   docker build --build-arg VERSION=$(make -s version) -t localhost/nftmesh:$(make -s version) .

FROM --platform=$BUILDPLATFORM golang:1.26-bookworm AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY . .
# The flags of the Makefile's GOBUILD: static, no build paths or build ID.
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    mkdir -p /out && CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -buildvcs=false \
      -ldflags="-s -w -buildid= -X github.com/nftmesh/nftmesh/internal/version.Version=${VERSION}" \
      -o /out/ ./cmd/nftmesh-agent ./cmd/nftmesh-cni ./cmd/nftmesh-cni-standalone ./cmd/redirect

# distroless/static adds CA certificates, /etc/passwd and tzdata, none of
# which the binaries need; the reference image has the binaries only. The
# agent runs as root (it writes the host's CNI dirs) with all capabilities
# dropped but the ones the chart adds.
FROM gcr.io/distroless/static-debian12:latest
ARG VERSION=dev
ARG REVISION=
LABEL org.opencontainers.image.title=nftmesh \
      org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.revision=$REVISION \
      org.opencontainers.image.source=https://github.com/nftmesh/nftmesh \
      org.opencontainers.image.licenses=Apache-2.0
COPY --from=build /out/nftmesh-agent /usr/local/bin/nftmesh-agent
# `kubectl exec <agent pod> -- redirect inspect ...`
COPY --from=build /out/redirect /usr/local/bin/redirect
# The agent's --plugin-binary default: the file it copies to the host.
COPY --from=build /out/nftmesh-cni /opt/cni/bin/nftmesh-cni
# Its companion, in the same directory: the agent copies it next to the
# front, which execs it when the agent is not there.
COPY --from=build /out/nftmesh-cni-standalone /opt/cni/bin/nftmesh-cni-standalone
USER 0:0
ENTRYPOINT ["/usr/local/bin/nftmesh-agent"]
