# nftmesh — thin Makefile of named targets. Run as root for the kernel tests
# and the demo (they create throw-away network namespaces).

SHELL     := /bin/bash
GO        ?= go
BIN       := bin
GOBIN     := $(shell $(GO) env GOPATH)/bin
CACHE     := .cache
APISERVER := $(CACHE)/kube-apiserver
ISTIO_BINS := $(CACHE)/pilot-agent $(CACHE)/istioctl
# Everything the cluster end-to-end test runs besides Debian's etcd,
# containerd and runc.
KUBE_BINS := kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl
HELM      := $(GOBIN)/helm
HELM_VERSION ?= v3.22.0
STATICCHECK_VERSION ?= v0.8.2
ACTIONLINT_VERSION ?= v1.7.12
# Go modules of their own besides the product's (build and release tools,
# the image tooling): `make test`, `make lint` and `make fuzz` run in each.
TOOL_MODULES := tools/release tools/imagebuild
# The real cosign, a test-only tool: TestMakePush verifies what `make push`
# signed with it (built from the module proxy into .cache/).
COSIGN_VERSION ?= v3.1.3
COSIGN    := $(CACHE)/cosign-$(COSIGN_VERSION)
FUZZTIME  ?= 10s
BENCHTIME ?= 200x
# Rounds of the side-by-side with Istio's plugin (each runs both), and
# 100-pod bursts per plugin.
SIDE_ROUNDS ?= 30
BURSTS    ?= 3

# One version for the binaries (--version, the plugin's about line, the
# agent's start log), the image's labels and tags, and the chart's version
# and appVersion. Its source is charts/nftmesh/Chart.yaml's appVersion, which
# only `make release` writes (docs/releasing.md): at the release tag vX.Y.Z
# VERSION is vX.Y.Z; anywhere else it is a development version that says so,
# vX.Y.Z-dev.N.gHASH[.dirty] (tools/release/version.sh). Override with
# `make VERSION=v1.2.3 ...`. Computed once, not at every use.
CHART_YAML        := charts/nftmesh/Chart.yaml
CHART_APP_VERSION := $(shell sed -n 's/^appVersion:[[:space:]]*"\{0,1\}\([^"[:space:]]*\)"\{0,1\}[[:space:]]*$$/\1/p' $(CHART_YAML))
ifeq ($(CHART_APP_VERSION),)
$(error $(CHART_YAML) has no appVersion line)
endif
# Whether the caller gave VERSION (make release takes only a given one).
VERSION_GIVEN     := $(filter-out undefined default,$(origin VERSION))
ifeq ($(origin VERSION),undefined)
VERSION           := $(shell ./tools/release/version.sh '$(CHART_APP_VERSION)')
endif
ifeq ($(VERSION),)
$(error tools/release/version.sh printed no version)
endif
REVISION          ?= $(shell git rev-parse HEAD 2>/dev/null)
# Image time and every file's mtime: the commit's time, so that the same
# source gives the same image.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
ARCH      ?= $(shell $(GO) env GOARCH)
# The image index's platforms (linux/<arch>); ARCH's image is also the
# docker-archive `ctr import` takes.
ARCHES    ?= amd64 arm64
comma     := ,
space     := $(subst ,, )
# The image tooling's commands, run in its own module.
IMAGEBUILD := $(GO) -C tools/imagebuild run
# Where `make push` puts the image (REGISTRY/nftmesh) and the chart
# (REGISTRY/charts/nftmesh). The default repository is the one the chart's
# nftmesh.image.repository names, so `make image` tags what the chart runs.
REGISTRY  ?= ghcr.io/nftmesh
IMAGE_REPO ?= $(REGISTRY)/nftmesh
IMAGE     ?= $(IMAGE_REPO):$(VERSION)
# Every tag `make push` gives the image under IMAGE_REPO: VERSION, and the
# chart's appVersion when that differs (vX.Y.Z-dev between releases). The
# in-tree chart's default tag is its appVersion, so `helm install ...
# charts/nftmesh --set nftmesh.image.repository=REGISTRY/nftmesh` from this
# checkout runs an image this checkout pushed; the packaged chart (`make
# chart`) names VERSION itself. At a release tag both are vX.Y.Z: one tag.
IMAGE_TAGS := $(VERSION) $(filter-out $(VERSION),$(CHART_APP_VERSION))
# The chart's version: VERSION without its "v" when that is SemVer (0.2.0,
# 0.2.0-dev.3.gabc1234), else 0.0.0-<VERSION> (an override such as
# VERSION=dev).
ifeq ($(origin CHART_VERSION),undefined)
CHART_VERSION := $(shell v=$$(echo '$(VERSION)' | sed 's/^v//'); \
  if echo "$$v" | grep -Eq '^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$$'; then echo "$$v"; \
  else echo "0.0.0-$$v" | tr -c '0-9A-Za-z.\n-' '-'; fi)
endif
# Static, reproducible binaries: no cgo, no build paths, no build ID or VCS
# stamp (the version is stamped instead).
GOBUILD   := CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false \
	-ldflags="-s -w -buildid= -X github.com/nftmesh/nftmesh/internal/version.Version=$(VERSION)"
export KUBE_APISERVER_BIN := $(abspath $(APISERVER))
export HELM_BIN := $(HELM)
export COSIGN_BIN := $(abspath $(COSIGN))
# The image e2e/cluster imports into its node's containerd.
export NFTMESH_IMAGE_TAR := $(abspath $(BIN)/nftmesh-image.tar)
export NFTMESH_IMAGE := $(IMAGE)
# Debian's nft of each of these suites, unpacked with its own libraries for
# the host nft version matrix (nft/hostnft_test.go); the machine's nft is
# never replaced.
HOST_NFT_SUITES ?= bookworm trixie
export NFTMESH_HOST_NFT_DIR := $(abspath $(CACHE)/hostnft)
# flannel (daemon, install-conf, its CNI plugin), the primary CNI of the
# cluster e2e's multi-node test.
FLANNEL_DIR := $(CACHE)/flannel
export NFTMESH_FLANNEL_DIR := $(abspath $(FLANNEL_DIR))

.PHONY: all build chain-timings host-nft scale image chart push image-ref image-tags chart-version version release test test-unit bench demo lint update-golden fuzz kube-apiserver kube-binaries e2e-cluster helm staticcheck actionlint cosign clean flannel istio pilot-agent istio-cni istio-manifests standin conformance conformance-ci conformance-bins conformance-images

all: build

build:
	@mkdir -p $(BIN)
	$(GOBUILD) -o $(BIN)/ ./cmd/...

## image: the container image, without Docker or a registry: an OCI image
## index of linux/<arch> for each of ARCHES, each image the four static
## binaries (the agent, the plugin's front and its companion, the CLI) on an
## empty base, as an OCI layout dir (bin/nftmesh-image.oci, what `make push`
## pushes); the linux/$(ARCH) image as a docker-archive tarball
## (`ctr -n k8s.io images import`, `docker load`); the index's SBOM
## (bin/nftmesh-image.spdx.json). Reproducible: the same source gives the
## same bytes. The image tooling is a Go module of its own (tools/imagebuild):
## no binary links it and the product's go.mod does not carry it.
image:
	@mkdir -p $(BIN)/image
	@set -e; for a in $(ARCHES); do \
	  echo "linux/$$a: $(BIN)/image/linux-$$a/"; \
	  GOOS=linux GOARCH=$$a $(GOBUILD) -o $(BIN)/image/linux-$$a/ ./cmd/nftmesh-agent ./cmd/nftmesh-cni ./cmd/nftmesh-cni-standalone ./cmd/redirect; \
	done
	$(IMAGEBUILD) ./mkimage --bin-dir $(abspath $(BIN)/image) --arch $(subst $(space),$(comma),$(strip $(ARCHES))) \
	  --version '$(VERSION)' --revision '$(REVISION)' --created '$(SOURCE_DATE_EPOCH)' --tag '$(IMAGE)' \
	  --oci-dir $(abspath $(BIN)/nftmesh-image.oci) --sbom $(abspath $(BIN)/nftmesh-image.spdx.json) \
	  --out $(abspath $(BIN)/nftmesh-image.tar) --archive-arch $(ARCH)

## chart: the Helm chart packaged as version CHART_VERSION (from VERSION),
## appVersion = VERSION (the default image tag), its default image
## repository IMAGE_REPO (REGISTRY/nftmesh: what `make push` pushes to), as
## bin/nftmesh-$(CHART_VERSION).tgz. The in-tree chart is not changed.
chart: $(HELM)
	@rm -rf $(BIN)/chart && mkdir -p $(BIN)/chart
	cp -R charts/nftmesh $(BIN)/chart/
	sed -i 's|^\(      repository: \)ghcr.io/nftmesh/nftmesh$$|\1$(IMAGE_REPO)|' $(BIN)/chart/nftmesh/values.yaml
	@grep -q '^      repository: $(IMAGE_REPO)$$' $(BIN)/chart/nftmesh/values.yaml || { echo "chart: values.yaml's nftmesh.image.repository line not found"; exit 1; }
	$(HELM) package $(BIN)/chart/nftmesh --version '$(CHART_VERSION)' --app-version '$(VERSION)' --destination $(BIN)

## push: the image index to IMAGE (REGISTRY/nftmesh:VERSION), its SBOM as an
## OCI referrer of it (`oras discover`), and the chart to
## REGISTRY/charts/nftmesh:CHART_VERSION (Helm's OCI layout), with
## go-containerregistry: no Docker, no helm push. With SIGNING_KEY=cosign.key
## (cosign's encrypted key; its password in COSIGN_PASSWORD) also a cosign
## signature of the index and the SBOM as a signed SPDX attestation
## (`cosign verify`, `cosign verify-attestation --type spdxjson`; see
## docs/supply-chain.md). Credentials: the Docker config (docker login, crane
## auth login); a registry on 127.0.0.1 or localhost is spoken to in plain
## HTTP. `make push REGISTRY=r` pushes the image to r/nftmesh under every
## tag of IMAGE_TAGS, and the chart naming that image: install the in-tree
## chart with --set nftmesh.image.repository=r/nftmesh, or the pushed one
## as it is. Prints what it pushed, by digest.
push: image chart
	$(IMAGEBUILD) ./push --oci-dir $(abspath $(BIN)/nftmesh-image.oci) --image '$(IMAGE)' \
	  $(foreach t,$(filter-out $(VERSION),$(IMAGE_TAGS)),--tag '$(t)') \
	  --sbom $(abspath $(BIN)/nftmesh-image.spdx.json) $(if $(SIGNING_KEY),--sign-key '$(abspath $(SIGNING_KEY))') \
	  --chart $(abspath $(BIN)/nftmesh-$(CHART_VERSION).tgz) --chart-repo '$(REGISTRY)/charts'

image-ref:
	@echo $(IMAGE)

image-tags:
	@echo $(IMAGE_TAGS)

chart-version:
	@echo $(CHART_VERSION)

version:
	@echo $(VERSION)

## release: cut release VERSION (vX.Y.Z, newer than the last, from a clean
## tree): Chart.yaml's version/appVersion and CHANGELOG.md's Unreleased
## section become X.Y.Z, committed and tagged vX.Y.Z, then Chart.yaml moves
## on to the next X.Y+1.0-dev. Nothing is pushed: `git push` the branch and
## the tag, and .github/workflows/release.yml publishes (docs/releasing.md).
## VERSION reaches the tool through the environment, never through the shell.
release: export NFTMESH_RELEASE_VERSION = $(if $(VERSION_GIVEN),$(VERSION))
release:
	@mkdir -p $(BIN)
	@$(GO) -C tools/release build -o $(abspath $(BIN))/release .
	@$(BIN)/release cut --repo '$(CURDIR)'

## test: everything CI runs — lint, all tests (kernel tests need root), short fuzzing.
## pilot-agent (Istio's, from the module proxy) runs the injected pods'
## istio-validation in testkit/istiotest's netns test.
test: build image kube-binaries pilot-agent flannel helm host-nft cosign lint
	$(GO) test -count=1 -timeout 40m ./...
	@# The agent runs the plugin's calls concurrently, in one process: its
	@# socket's tests again under the race detector.
	$(GO) test -count=1 -race -run 'TestServe|TestAgent' ./cniplugin/
	@# The tool modules (release, image tooling): ./... above does not reach them.
	for m in $(TOOL_MODULES); do $(GO) -C $$m test -count=1 -timeout 20m ./... || exit 1; done
	$(MAKE) fuzz

## test-unit: the tests that need neither root nor the apiserver build.
test-unit:
	$(GO) test -count=1 -short ./...
	for m in $(TOOL_MODULES); do $(GO) -C $$m test -count=1 -short ./... || exit 1; done

# SETTLE waits (5 s at least, 120 s at most) until the machine's 1-minute
# load average is under 1.5 again: the kernel tears down the hundreds of
# network namespaces a group leaves behind on the same cores, for tens of
# seconds after a group of hundreds of ADDs.
SETTLE = @sleep 5; for i in $$(seq 23); do awk '{exit !($$1 >= 1.5)}' /proc/loadavg || break; sleep 5; done; echo "load before the next group: $$(cut -d' ' -f1 /proc/loadavg)"

## bench: Go benchmarks side by side, then the whole-process comparison with
## iptables-restore and nft (the binaries are only the competition here),
## then nftmesh-cni against Istio's own istio-cni plugin and, for a Linkerd
## pod, Linkerd's linkerd-cni (e2e/bench: same loop, alternating, fresh netns
## each ADD; ratios are ours/theirs).
# The kernel tears down the hundreds of network namespaces a group leaves
# behind asynchronously, on the same cores; SETTLE keeps that work out of the
# next group's figures.
bench: build $(CACHE)/istio-cni $(APISERVER)
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -benchmem ./redirect/ ./nft/ ./iptables/
	$(SETTLE)
	$(GO) test -run '^$$' -bench WholeProcess -benchtime 200x ./cmd/redirect/
	$(SETTLE)
	$(GO) test -run '^$$' -bench PluginAdd -benchtime $(BENCHTIME) ./cniplugin/
	$(SETTLE)
	$(GO) test -run '^$$' -bench '^Benchmark(Version|PluginAlone|AgentUp|LinkerdAgentUp)$$' -benchtime $(SIDE_ROUNDS)x ./e2e/bench/
	$(SETTLE)
	$(GO) test -run '^$$' -bench Burst -benchtime $(BURSTS)x -timeout 30m ./e2e/bench/
	$(GO) test -run '^$$' -bench AgentAtScale -benchtime 1x -timeout 30m ./e2e/bench/

## scale: the scale contract (e2e/bench BenchmarkScaleContract): K real
## agents against one real kube-apiserver holding P pods over N nodes, then
## 2P over 2N; an agent's requests, bytes and memory must not grow with the
## cluster. Sizes: NFTMESH_SCALE_PODS, _NODES, _AGENTS (50000, 500, 20).
scale: $(APISERVER)
	$(GO) test -run '^$$' -bench ScaleContract -benchtime 1x -timeout 90m -v ./e2e/bench/

## e2e-cluster: a real single-node Kubernetes v1.35.4 cluster (kubelet,
## containerd) in private namespaces, the image imported, `helm install` of
## the chart, pods through the CNI chain; TestMultiNode adds two nodes on
## flannel (VXLAN; NFTMESH_E2E_NODES=<n> for n in all), then TestReadmeInstall
## runs the README's install blocks against a registry on loopback (last:
## see its file); torn down afterwards (root).
## RUN=<regexp> picks assertions (go test -run); the cluster comes up anyway.
e2e-cluster: image kube-binaries helm pilot-agent flannel
	$(GO) test -count=1 -v -timeout 25m $(if $(RUN),-run '$(RUN)') ./e2e/cluster/

## chain-timings: the real chain's figures (docs/performance.md): each
## plugin's ADD as containerd runs it and pod create → app started, without
## and with nftmesh-cni in interleaved blocks (32 pods each side), then 30
## injected pods, on the cluster e2e's node. A measurement, so not in `make test`.
chain-timings: image kube-binaries helm pilot-agent
	NFTMESH_E2E_CHAIN=1 $(GO) test -count=1 -v -timeout 25m -run 'TestClusterUp|TestPodStartWithoutPlugin|TestChainTimings' ./e2e/cluster/

## conformance: Kubernetes' own [sig-network] [Conformance] specs (e2e.test
## v1.35.4, built from the module proxy) on the cluster e2e's rig grown to
## three nodes with the chart installed and CoreDNS as the cluster DNS, run
## twice: "no harm" (test namespaces unmeshed) and "meshed" (every test
## namespace labelled, a mutating webhook adding Istio's istio-validation
## and the forwarding stand-in proxy as UID 1337 to every pod).
## FOCUS=<regex> narrows both runs (default: the whole set), SKIP=<regex>
## leaves specs out; RUNS=noharm or
## RUNS=meshed runs one; SIDECAR=container injects Istio's classic
## sidecar (a container after the app's) instead of its native one. Results and their reading: docs/conformance.md. A
## measurement of its own, so not in `make test`.
FOCUS     ?= \[sig-network\].*\[Conformance\]
RUNS      ?= noharm,meshed
SIDECAR   ?= native
SKIP      ?=
E2E_TEST  := $(CACHE)/e2e.test-v1.35.4
COREDNS_VERSION ?= v1.14.7
CONFORMANCE_IMAGES := $(BIN)/conformance
conformance: image kube-binaries helm pilot-agent flannel conformance-images
	NFTMESH_E2E_CONFORMANCE=1 NFTMESH_E2E_TEST_BIN=$(abspath $(E2E_TEST)) \
	  NFTMESH_CONFORMANCE_IMAGES=$(abspath $(CONFORMANCE_IMAGES)) NFTMESH_CONFORMANCE_FOCUS='$(FOCUS)' \
	  NFTMESH_CONFORMANCE_SKIP='$(SKIP)' \
	  NFTMESH_CONFORMANCE_RUNS='$(RUNS)' NFTMESH_CONFORMANCE_SIDECAR='$(SIDECAR)' \
	  $(GO) test -count=1 -v -timeout 240m -run 'TestClusterUp|TestConformance' ./e2e/cluster/

## conformance-ci: the fixed subset CI runs after make test (.ci/run): the
## intra-pod and node-pod, Service and DNS specs (11; no NodePort spec, see
## docs/conformance.md), both runs, on a rig of its own (its kubelets name
## a cluster DNS, make test's do not).
CONFORMANCE_CI_FOCUS := \[sig-network\] (Networking Granular Checks: Pods|Services should (serve|be able to change the type from ExternalName to ClusterIP)|DNS should (provide DNS for (the cluster|services)|resolve DNS of partial)).*\[Conformance\]
conformance-ci:
	$(MAKE) conformance FOCUS='$(CONFORMANCE_CI_FOCUS)' RUNS=noharm,meshed SKIP=

## conformance-bins: e2e.test, agnhost and CoreDNS built from the module
## proxy, and the test images' Debian root, into .cache/ (kept if present).
conformance-bins: $(E2E_TEST)
	COREDNS_VERSION=$(COREDNS_VERSION) ./testkit/kubetest/build-conformance-bins.sh $(CACHE)
	./testkit/kubetest/fetch-testroot.sh $(CACHE)/conformance-testroot-bookworm.tar
$(E2E_TEST):
	./testkit/kubetest/build-e2e.sh $(abspath $@)

## conformance-images: the images the specs pull, under the names e2e.test
## asks for (docker-archives in bin/conformance/, imported on every node).
CONFORMANCE_ROOT := $(abspath $(CACHE)/conformance-testroot-bookworm.tar)
conformance-images: conformance-bins
	@mkdir -p $(CONFORMANCE_IMAGES)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o $(CONFORMANCE_IMAGES)/pause ./e2e/cluster/standin/cmd/pause
	$(IMAGEBUILD) ./rootimage --out $(abspath $(CONFORMANCE_IMAGES))/agnhost.tar --root $(CONFORMANCE_ROOT) \
	  --file /agnhost=$(abspath $(CACHE))/agnhost-2.59 --link /agnhost-2=agnhost --entrypoint /agnhost --cmd pause \
	  --file /localhost.crt=$(abspath $(CACHE))/agnhost-2.59.localhost.crt --file /localhost.key=$(abspath $(CACHE))/agnhost-2.59.localhost.key \
	  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	  --tag registry.k8s.io/e2e-test-images/agnhost:2.59
	$(IMAGEBUILD) ./rootimage --out $(abspath $(CONFORMANCE_IMAGES))/testroot.tar --root $(CONFORMANCE_ROOT) --cmd sh \
	  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	  --tag registry.k8s.io/e2e-test-images/busybox:1.37.0-1 --tag registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7
	$(IMAGEBUILD) ./rootimage --out $(abspath $(CONFORMANCE_IMAGES))/coredns.tar \
	  --file /coredns=$(abspath $(CACHE))/coredns-$(COREDNS_VERSION) --entrypoint /coredns --tag localhost/coredns:e2e
	$(IMAGEBUILD) ./rootimage --out $(abspath $(CONFORMANCE_IMAGES))/pause.tar \
	  --file /pause=$(abspath $(CONFORMANCE_IMAGES))/pause --entrypoint /pause --tag registry.k8s.io/pause:3.10.1

## demo: a throw-away pod netns, real connections, where each one landed.
demo: build
	./$(BIN)/redirect demo

lint: staticcheck actionlint
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GOBIN)/staticcheck ./...
	for m in $(TOOL_MODULES); do (cd $$m && $(GO) vet ./... && $(GOBIN)/staticcheck ./...) || exit 1; done
	@# The GitHub workflows (.github/workflows/*.yml): syntax, expressions,
	@# action inputs, and their run scripts through shellcheck when installed.
	$(GOBIN)/actionlint
	@# The import and exec rules (the layers, the pure model, no test kit in
	@# product code, only capture drives the backends, what the plugin's
	@# front and standalone binary may link, no exec in product code): one Go
	@# test over the import graph, each rule named in lint/imports_test.go.
	$(GO) test -count=1 ./lint/

update-golden:
	UPDATE_GOLDEN=1 $(GO) test -count=1 -run 'Golden' ./...

## fuzz: every Fuzz target for FUZZTIME each (CI: 10s; by hand: FUZZTIME=5m).
fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) ./.ci/fuzz.sh cmd nft iptables redirect podinfo installer internal e2e capture netlab cniplugin charts
	for m in $(TOOL_MODULES); do (cd $$m && FUZZTIME=$(FUZZTIME) GO=$(GO) $(CURDIR)/.ci/fuzz.sh .) || exit 1; done

## host-nft: Debian's nft of HOST_NFT_SUITES in .cache/hostnft/<suite>/ (test-only readers).
host-nft:
	./testkit/hostnft/fetch.sh $(NFTMESH_HOST_NFT_DIR) $(HOST_NFT_SUITES)

kube-apiserver: $(APISERVER)
$(APISERVER):
	./testkit/kubetest/build-apiserver.sh $(abspath $(APISERVER))

## istio: Istio's own pilot-agent and istioctl, built from the istio.io/istio
## module pinned in testkit/istiotest/istio (cached in .cache/, kept if
## present). pilot-agent alone is what the injected istio-validation runs;
## istio-cni (Istio's CNI plugin) is only the competition in `make bench`.
istio: $(ISTIO_BINS)
pilot-agent: $(CACHE)/pilot-agent
istio-cni: $(CACHE)/istio-cni
$(CACHE)/pilot-agent $(CACHE)/istioctl $(CACHE)/istio-cni:
	./testkit/istiotest/build-istio.sh $(CACHE) $(notdir $@)

## istio-manifests: regenerate testdata/istio with Istio's injector (review the diff).
istio-manifests: $(CACHE)/istioctl
	UPDATE_GOLDEN=1 $(GO) test -count=1 -run 'TestIstioInjectGolden' ./testkit/istiotest/

## standin: the static programs injected pods run offline (bin/standin/):
## standin-proxy (istio-proxy), standin-app (the app), pause (the sandbox).
standin:
	@mkdir -p $(BIN)/standin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o $(BIN)/standin/ ./e2e/cluster/standin/cmd/...

## flannel: flannel v0.28.10 (flanneld, its install-conf) and the flannel
## CNI plugin of containernetworking/plugins v0.9.1, from the module proxy,
## into .cache/flannel/ (kept if present): the multi-node e2e's primary CNI.
flannel:
	./e2e/cluster/flannel/build.sh $(FLANNEL_DIR)

# One go build for all that are missing (build-kube.sh skips the others).
kube-binaries:
	./testkit/kubetest/build-kube.sh $(CACHE) $(KUBE_BINS)

helm: $(HELM)
$(HELM):
	$(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

cosign: $(COSIGN)
$(COSIGN):
	@mkdir -p $(dir $@)
	GOBIN=$(abspath $@).tmp $(GO) install github.com/sigstore/cosign/v3/cmd/cosign@$(COSIGN_VERSION)
	mv $@.tmp/cosign $@ && rmdir $@.tmp

staticcheck: $(GOBIN)/staticcheck
$(GOBIN)/staticcheck:
	$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

actionlint: $(GOBIN)/actionlint
$(GOBIN)/actionlint:
	$(GO) install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)

clean:
	rm -rf $(BIN)
