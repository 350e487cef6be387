package installer

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
	metricsNamespace        = "nftmesh"
	metricsSubsystemInstall = "install"
	metricsSubsystemRepair  = "repair"
)

// Metrics are the agent's Prometheus series in their own registry, so
// tests and embedders do not share global state.
type Metrics struct {
	Registry  *prometheus.Registry
	Installs  *prometheus.CounterVec
	Ready     prometheus.Gauge
	Reinserts prometheus.Counter
	Fights    prometheus.Counter
	Repairs   *prometheus.CounterVec
	// PluginEvents counts the plugin's decision lines seen in its log.
	PluginEvents *prometheus.CounterVec
}

// NewMetrics registers the agent's series and the Go/process collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Installs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "installs_total",
			Help: "Install passes of the plugin (binary, kubeconfig, CNI config) by result.",
		}, []string{"result"}),
		Ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "install_ready",
			Help: "1 while the plugin is installed and its CNI config is valid.",
		}),
		Reinserts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "reinserts_total",
			Help: "Times the plugin entry had to be put back after something rewrote the CNI config.",
		}),
		Fights: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "fights_total",
			Help: "Re-inserts that came faster than --fight-threshold per --fight-window: another component keeps reverting the CNI config.",
		}),
		Repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: metricsSubsystemRepair, Name: "pods_total",
			Help: "Broken pods handled by the repair controller by mode and result.",
		}, []string{"mode", "result"}),
		PluginEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Subsystem: "plugin", Name: "events_total",
			Help: "The plugin's decisions by CNI command and decision (capture, skip, error), from its log file.",
		}, []string{"command", "decision"}),
	}
	m.Registry.MustRegister(m.Installs, m.Ready, m.Reinserts, m.Fights, m.Repairs, m.PluginEvents,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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
