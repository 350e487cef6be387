// Package metrics owns the node agent's Prometheus series (nftmesh's names
// and Istio's istio-cni names for the same facts), the /healthz and
// /readyz handler and the small HTTP server both are served from. It
// counts what the other jobs report and decides nothing itself.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Install results, as the installs_total label values.
const (
	ResultSuccess           = "success"
	ResultCopyBinaries      = "copy_binaries_failure"
	ResultKubeconfig        = "create_kubeconfig_failure"
	ResultCNIConfig         = "create_cni_config_failure"
	ResultWaitingForPrimary = "waiting_for_primary"
)

// Metrics are the agent's Prometheus series in their own registry, so
// tests and embedders do not share global state.
type Metrics struct {
	Registry  *prometheus.Registry
	Installs  *prometheus.CounterVec
	Ready     prometheus.Gauge
	Reinserts prometheus.Counter
	Fights    prometheus.Counter
	// ForeignCapture is 1 for the other capture plugin (istio-cni) while
	// the CNI config chains it and ours is therefore kept out.
	ForeignCapture *prometheus.GaugeVec
	Repairs        *prometheus.CounterVec
	// RepairAPIReachable is 1 while the repair controller's last list or
	// watch of pods succeeded; RepairAPIErrors counts the failed ones.
	RepairAPIReachable prometheus.Gauge
	RepairAPIErrors    prometheus.Counter
	// PluginEvents counts the plugin's decision records seen in its log.
	PluginEvents *prometheus.CounterVec
	// AddDuration and LookupDuration time the plugin's runs, from the
	// duration_ms and lookup_ms of its decision records.
	AddDuration    *prometheus.HistogramVec
	LookupDuration *prometheus.HistogramVec
	// Lookups counts the plugin's pod lookups by where the pod came from:
	// the node agent's socket or the plugin's own API read.
	Lookups *prometheus.CounterVec
	// AddByPath times the plugin's ADD runs by who ran them: the agent
	// (the call handed over on its socket) or the standalone plugin.
	AddByPath *prometheus.HistogramVec
	// AgentReady is the time from the agent's start until it could first
	// program pods; PodWatchSync until its watch had listed the node's pods.
	AgentReady   prometheus.Histogram
	PodWatchSync prometheus.Histogram

	// Istio's names for the same facts, so dashboards and alerts written
	// for istio-cni keep working: see the istio* methods for the labels.
	IstioInstalls *prometheus.CounterVec
	IstioReady    prometheus.Gauge
	IstioRepairs  *prometheus.CounterVec
}

// istioInstallResults maps our install results to the label values of
// istio_cni_installs_total. Results without an Istio counterpart (waiting
// for the primary CNI) are not counted there.
var istioInstallResults = map[string]string{
	ResultSuccess:      "SUCCESS",
	ResultCopyBinaries: "COPY_BINARIES_FAILURE",
	ResultKubeconfig:   "CREATE_KUBECONFIG_FAILURE",
	ResultCNIConfig:    "CREATE_CNI_CONFIG_FAILURE",
}

// Install counts one install pass under both names.
func (m *Metrics) Install(result string) {
	m.Installs.WithLabelValues(result).Inc()
	if r, ok := istioInstallResults[result]; ok {
		m.IstioInstalls.WithLabelValues(r).Inc()
	}
}

// SetReady sets both readiness gauges.
func (m *Metrics) SetReady(ready bool) {
	v := 0.0
	if ready {
		v = 1
	}
	m.Ready.Set(v)
	m.IstioReady.Set(v)
}

// Repaired counts one handled broken pod under both names. Istio's "type"
// label takes the same values as our repair modes (repair, delete,
// label), and its results are ours (success, skip, fail).
func (m *Metrics) Repaired(mode, result string) {
	m.Repairs.WithLabelValues(mode, result).Inc()
	m.IstioRepairs.WithLabelValues(mode, result).Inc()
}

// New registers the agent's series and the Go/process collectors.
func New() *Metrics {
	r := series{prometheus.NewRegistry()}
	// From half a millisecond (a skip) to half a minute (the plugin's
	// apply timeout; a lookup's API timeout is below it).
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 17)
	// From 50 ms to about 7 minutes: a start waits on the primary CNI's
	// config and the API server.
	startBuckets := prometheus.ExponentialBuckets(0.05, 2, 14)
	m := &Metrics{
		Registry: r.Registry,
		Installs: r.counterVec("nftmesh_installs_total",
			"Install passes of the plugin (binary, kubeconfig, CNI config) by result.", "result"),
		Ready: r.gauge("nftmesh_install_ready",
			"1 while the plugin is installed and its CNI config is valid."),
		Reinserts: r.counter("nftmesh_reinserts_total",
			"Times the plugin entry had to be put back after something rewrote the CNI config."),
		Fights: r.counter("nftmesh_fights_total",
			"Re-inserts that came faster than --fight-threshold per --fight-window: another component keeps reverting the CNI config."),
		Repairs: r.counterVec("nftmesh_repair_pods_total",
			"Broken pods handled by the repair controller by mode and result.", "mode", "result"),
		PluginEvents: r.counterVec("nftmesh_plugin_events_total",
			"The plugin's decisions by CNI command and decision (capture, skip, error), from its log file, whatever the plugin's log level.", "command", "decision"),
		AddDuration: r.histogramVec("nftmesh_cni_add_duration_seconds",
			"Wall time of the plugin's CNI ADD runs by decision (capture, skip, error), whatever the plugin's log level.", buckets, "decision"),
		LookupDuration: r.histogramVec("nftmesh_cni_pod_lookup_duration_seconds",
			"Time the plugin spent looking the pod up (asking the agent, else kubeconfig, client, GET) by CNI command, failed lookups included.", buckets, "command"),
		Lookups: r.counterVec("nftmesh_cni_pod_lookups_total",
			"The plugin's pod lookups by CNI command and path: agent (answered on the agent's socket, no API read) or api (the plugin's own GET).", "command", "path"),
		AddByPath: r.histogramVec("nftmesh_cni_add_duration_by_path_seconds",
			"Wall time of the plugin's CNI ADD runs by path: agent (handed over by the nftmesh-cni front on the agent's socket) or standalone (the front ran nftmesh-cni-standalone).", buckets, "path"),
		AgentReady: r.histogram("nftmesh_agent_ready_seconds",
			"Time from the agent's start until it could first program pods (plugin in the CNI config, pod watch synced, CNI socket listening).", startBuckets),
		PodWatchSync: r.histogram("nftmesh_agent_pod_watch_sync_seconds",
			"Time from the start of the agent's watch of its node's pods until its first list was in the cache.", startBuckets),
		ForeignCapture: r.gaugeVec("nftmesh_foreign_capture_plugin",
			"1 while the CNI config chains another capture plugin (label plugin, e.g. istio-cni) and nftmesh-cni is kept out of it.", "plugin"),
		RepairAPIReachable: r.gauge("nftmesh_repair_api_reachable",
			"1 while the repair controller's last list or watch of its node's pods succeeded, 0 while it cannot reach the API server (broken pods are then not repaired)."),
		RepairAPIErrors: r.counter("nftmesh_repair_api_errors_total",
			"Failed lists and watches of the repair controller (expired resource versions excluded)."),
		IstioInstalls: r.counterVec("istio_cni_installs_total",
			"Install passes by result, under Istio's name and label values (SUCCESS, COPY_BINARIES_FAILURE, CREATE_KUBECONFIG_FAILURE, CREATE_CNI_CONFIG_FAILURE); nftmesh_installs_total has the same passes.", "result"),
		IstioReady: r.gauge("istio_cni_install_ready",
			"Istio's name for nftmesh_install_ready: 1 while the plugin is installed and its CNI config is valid."),
		IstioRepairs: r.counterVec("istio_cni_repair_pods_repaired_total",
			"Broken pods handled by the repair controller, under Istio's name: type repair, delete or label; result success, skip or fail.", "type", "result"),
	}
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// series makes each of the agent's series under its full name and
// registers it.
type series struct{ *prometheus.Registry }

func (r series) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	r.MustRegister(c)
	return c
}

func (r series) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	r.MustRegister(c)
	return c
}

func (r series) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	r.MustRegister(g)
	return g
}

func (r series) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	r.MustRegister(g)
	return g
}

func (r series) histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	r.MustRegister(h)
	return h
}

func (r series) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	r.MustRegister(h)
	return h
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// HealthHandler serves /healthz (the process is alive) and /readyz (ready()
// returns nil only while the plugin is installed and its config valid).
func HealthHandler(ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := ready(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// Server is a started HTTP listener.
type Server struct {
	srv  *http.Server
	Addr net.Addr
	done chan error
}

// Serve listens on addr and serves h until Shutdown.
func Serve(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	s := &Server{
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second},
		Addr: ln.Addr(),
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Shutdown stops the server and waits for it.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
