// Package metrics owns the node agent's Prometheus series (nftmesh's names
// and istio-cni's for the same facts), the /healthz and /readyz handler
// and the HTTP server for both. It counts what the other jobs report and
// decides nothing itself.
package metrics

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nftmesh/nftmesh/podinfo/agentsock"
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
// tests and embedders do not share global state. Each series' help text
// (New) says what it counts.
type Metrics struct {
	Registry           *prometheus.Registry
	Installs           *prometheus.CounterVec
	Ready              prometheus.Gauge
	Reinserts          prometheus.Counter
	Fights             prometheus.Counter
	ForeignCapture     *prometheus.GaugeVec
	Repairs            *prometheus.CounterVec
	RepairAPIReachable prometheus.Gauge
	RepairAPIErrors    prometheus.Counter
	PluginEvents       *prometheus.CounterVec
	AddDuration        *prometheus.HistogramVec
	LookupDuration     *prometheus.HistogramVec
	Lookups            *prometheus.CounterVec
	AddByPath          *prometheus.HistogramVec
	AgentReady         prometheus.Histogram
	PodWatchSync       prometheus.Histogram

	// Istio's names for the same facts, so dashboards and alerts written
	// for istio-cni keep working.
	IstioInstalls *prometheus.CounterVec
	IstioReady    prometheus.Gauge
	IstioRepairs  *prometheus.CounterVec
}

// istioInstallResults are istio_cni_installs_total's label values; a
// result without one (waiting for the primary CNI) is not counted there.
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

// Repaired counts one handled broken pod under both names (Istio's type
// and result values are ours).
func (m *Metrics) Repaired(mode, result string) {
	m.Repairs.WithLabelValues(mode, result).Inc()
	m.IstioRepairs.WithLabelValues(mode, result).Inc()
}

// The label values of the plugin's decisions.
var (
	pluginCommands    = []string{"ADD", "DEL", "CHECK", "STATUS", "GC"}
	pluginDecisions   = []string{"capture", "skip", "remove", "error"}
	pluginLookupPaths = []string{"agent", "api"}
	pluginRanBy       = []string{"agent", "standalone"}
)

// Decided counts one plugin run's decision, its ADD's time and its pod
// lookup. Label values outside the plugin's vocabulary (a stray line of
// its log file) are counted as "OTHER" or "other", so they cannot grow
// the series without bound.
func (m *Metrics) Decided(d agentsock.Decision) {
	command, decision := d.Command, d.Decision
	if !slices.Contains(pluginCommands, command) {
		command = "OTHER"
	}
	if !slices.Contains(pluginDecisions, decision) {
		decision = "other"
	}
	m.PluginEvents.WithLabelValues(command, decision).Inc()
	if command == "ADD" && d.Took >= 0 {
		m.AddDuration.WithLabelValues(decision).Observe(d.Took.Seconds())
		if slices.Contains(pluginRanBy, d.RanBy) {
			m.AddByPath.WithLabelValues(d.RanBy).Observe(d.Took.Seconds())
		}
	}
	if d.LookupTook >= 0 {
		m.LookupDuration.WithLabelValues(command).Observe(d.LookupTook.Seconds())
	}
	if path := d.Lookup; path != "" {
		if !slices.Contains(pluginLookupPaths, path) {
			path = "other"
		}
		m.Lookups.WithLabelValues(command, path).Inc()
	}
}

// New registers the agent's series and the Go/process collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	f := promauto.With(reg)
	// From half a millisecond (a skip) to half a minute (the plugin's
	// apply timeout; a lookup's API timeout is below it).
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 17)
	// From 50 ms to about 7 minutes: a start waits on the primary CNI's
	// config and the API server.
	startBuckets := prometheus.ExponentialBuckets(0.05, 2, 14)
	m := &Metrics{
		Registry: reg,
		Installs: f.NewCounterVec(prometheus.CounterOpts{Name: "nftmesh_installs_total",
			Help: "Install passes of the plugin (binary, kubeconfig, CNI config) by result."}, []string{"result"}),
		Ready: f.NewGauge(prometheus.GaugeOpts{Name: "nftmesh_install_ready",
			Help: "1 while the plugin is installed and its CNI config is valid."}),
		Reinserts: f.NewCounter(prometheus.CounterOpts{Name: "nftmesh_reinserts_total",
			Help: "Times the plugin entry had to be put back after something rewrote the CNI config."}),
		Fights: f.NewCounter(prometheus.CounterOpts{Name: "nftmesh_fights_total",
			Help: "Re-inserts that came faster than --fight-threshold per --fight-window: another component keeps reverting the CNI config."}),
		Repairs: f.NewCounterVec(prometheus.CounterOpts{Name: "nftmesh_repair_pods_total",
			Help: "Broken pods handled by the repair controller by mode and result."}, []string{"mode", "result"}),
		PluginEvents: f.NewCounterVec(prometheus.CounterOpts{Name: "nftmesh_plugin_events_total",
			Help: "The plugin's decisions by CNI command and decision (capture, skip, error), whatever the plugin's log level."}, []string{"command", "decision"}),
		AddDuration: f.NewHistogramVec(prometheus.HistogramOpts{Name: "nftmesh_cni_add_duration_seconds",
			Help: "Wall time of the plugin's CNI ADD runs by decision (capture, skip, error), whatever the plugin's log level.", Buckets: buckets}, []string{"decision"}),
		LookupDuration: f.NewHistogramVec(prometheus.HistogramOpts{Name: "nftmesh_cni_pod_lookup_duration_seconds",
			Help: "Time the plugin spent looking the pod up (asking the agent, else kubeconfig, client, GET) by CNI command, failed lookups included.", Buckets: buckets}, []string{"command"}),
		Lookups: f.NewCounterVec(prometheus.CounterOpts{Name: "nftmesh_cni_pod_lookups_total",
			Help: "The plugin's pod lookups by CNI command and path: agent (answered on the agent's socket, no API read) or api (the plugin's own GET)."}, []string{"command", "path"}),
		AddByPath: f.NewHistogramVec(prometheus.HistogramOpts{Name: "nftmesh_cni_add_duration_by_path_seconds",
			Help: "Wall time of the plugin's CNI ADD runs by path: agent (handed over by the nftmesh-cni front on the agent's socket) or standalone (the front ran nftmesh-cni-standalone).", Buckets: buckets}, []string{"path"}),
		AgentReady: f.NewHistogram(prometheus.HistogramOpts{Name: "nftmesh_agent_ready_seconds",
			Help: "Time from the agent's start until it could first program pods (plugin in the CNI config, pod watch synced, CNI socket listening).", Buckets: startBuckets}),
		PodWatchSync: f.NewHistogram(prometheus.HistogramOpts{Name: "nftmesh_agent_pod_watch_sync_seconds",
			Help: "Time from the start of the agent's watch of its node's pods until its first list was in the cache.", Buckets: startBuckets}),
		ForeignCapture: f.NewGaugeVec(prometheus.GaugeOpts{Name: "nftmesh_foreign_capture_plugin",
			Help: "1 while the CNI config chains another capture plugin (label plugin, e.g. istio-cni) and nftmesh-cni is kept out of it."}, []string{"plugin"}),
		RepairAPIReachable: f.NewGauge(prometheus.GaugeOpts{Name: "nftmesh_repair_api_reachable",
			Help: "1 while the repair controller's last list or watch of its node's pods succeeded, 0 while it cannot reach the API server (broken pods are then not repaired)."}),
		RepairAPIErrors: f.NewCounter(prometheus.CounterOpts{Name: "nftmesh_repair_api_errors_total",
			Help: "Failed lists and watches of the repair controller (expired resource versions excluded)."}),
		IstioInstalls: f.NewCounterVec(prometheus.CounterOpts{Name: "istio_cni_installs_total",
			Help: "Install passes by result, under Istio's name and label values (SUCCESS, COPY_BINARIES_FAILURE, CREATE_KUBECONFIG_FAILURE, CREATE_CNI_CONFIG_FAILURE); nftmesh_installs_total has the same passes."}, []string{"result"}),
		IstioReady: f.NewGauge(prometheus.GaugeOpts{Name: "istio_cni_install_ready",
			Help: "Istio's name for nftmesh_install_ready: 1 while the plugin is installed and its CNI config is valid."}),
		IstioRepairs: f.NewCounterVec(prometheus.CounterOpts{Name: "istio_cni_repair_pods_repaired_total",
			Help: "Broken pods handled by the repair controller, under Istio's name: type repair, delete or label; result success, skip or fail."}, []string{"type", "result"}),
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
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
