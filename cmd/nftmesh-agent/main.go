// Command nftmesh-agent is the nftmesh node agent, run by the DaemonSet on
// every node: it installs the nftmesh-cni plugin (its binaries, nftmesh-cni
// and the companion nftmesh-cni-standalone; kubeconfig; CNI config entry),
// keeps it installed while the primary CNI rewrites its files, serves
// health, readiness and metrics, runs the repair controller, and on SIGTERM
// removes everything it installed.
//
// Every host path is a flag, so it also runs outside a cluster against a
// directory tree standing in for a node (tests, demos, debugging).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/go-logr/zerologr"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/nftmesh/nftmesh/capture"
	"github.com/nftmesh/nftmesh/cniplugin"
	"github.com/nftmesh/nftmesh/installer"
	"github.com/nftmesh/nftmesh/installer/inplace"
	"github.com/nftmesh/nftmesh/installer/metrics"
	"github.com/nftmesh/nftmesh/installer/pluginlog"
	"github.com/nftmesh/nftmesh/installer/podcache"
	"github.com/nftmesh/nftmesh/installer/repair"
	"github.com/nftmesh/nftmesh/internal/kubeconf"
	"github.com/nftmesh/nftmesh/internal/version"
)

// Exit codes: 2 is bad configuration, found before any host file is touched.
const (
	exitOK     = 0
	exitFailed = 1
	exitConfig = 2
)

// Repair in place enters pod namespaces from locked threads (netlink,
// nftables sockets); holding the main goroutine on the main thread keeps
// them off it: /proc/self/ns/net shows its namespace, and the backends'
// host-namespace guard compares against that.
func init() { runtime.LockOSThread() }

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv))
}

func run(args []string, getenv func(string) (string, bool)) int {
	// The agent takes no arguments: --version anywhere is the request.
	if slices.Contains(args, "--version") {
		fmt.Fprintln(os.Stdout, version.Line("nftmesh-agent"))
		return exitOK
	}
	start := time.Now()
	cfg, code := parseConfig(args, getenv)
	if cfg == nil {
		return code
	}
	a := &agent{cfg: cfg, log: agentLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel), m: metrics.New(), starved: newStarvation()}
	defer func() { a.events.shutdown() }()
	if !a.setUp() || !a.serve() {
		return exitConfig
	}
	defer a.stopServers()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	a.log.Info().Str("version", version.Get()).Strs("bin_dirs", cfg.CNIBinDirs).Str("conf_dir", cfg.CNIConfDir).Bool("chained", cfg.Chained).
		Str("conf_file", cfg.CNIConfFileName).Str("run_dir", cfg.AgentRunDir).Str("repair", string(cfg.Repair.Mode())).
		Msg("starting")
	return a.runUntilStopped(ctx, stop, start)
}

// parseConfig reads the flags and variables; a nil config means run ends
// with code (help was asked for, or the configuration is invalid).
func parseConfig(args []string, getenv func(string) (string, bool)) (*installer.Config, int) {
	cfg, err := installer.ParseConfig(args, getenv)
	if errors.Is(err, pflag.ErrHelp) {
		fmt.Fprintf(os.Stdout, "Usage: nftmesh-agent [flags]\n       nftmesh-agent --version\n\nEvery flag can also be set as NFTMESH_<FLAG> (e.g. NFTMESH_CNI_CONF_DIR);\nIstio's install-cni variables (CNI_CONF_NAME, CHAINED_CNI_PLUGIN, EXCLUDE_NAMESPACES,\nMOUNTED_CNI_NET_DIR, REPAIR_*, ...) are accepted too. Flags win over variables.\n\n%s", installer.Usage())
		return nil, exitOK
	}
	if err != nil {
		log := newLogger(os.Stderr, "json")
		log.Error().Err(err).Msg("invalid configuration; nothing was changed on the host")
		return nil, exitConfig
	}
	return cfg, exitOK
}

// agent is what run starts, in order: the installer, repair, the API
// client, pod events, the pod socket and the HTTP servers.
type agent struct {
	cfg       *installer.Config
	log       zerolog.Logger
	m         *metrics.Metrics
	in        *installer.Installer
	client    corev1client.CoreV1Interface
	repairCtl *repair.Controller
	events    *podEvents
	sock      *podSocket
	servers   []*metrics.Server
	starved   *starvation // calls declined for lack of a resource, for readiness
}

// setUp builds everything before the agent touches the host; false when
// the configuration is invalid (logged: nothing was changed on the host).
func (a *agent) setUp() bool {
	cfg, log := a.cfg, a.log
	in, err := installer.New(cfg, log, a.m)
	if err != nil {
		log.Error().Err(err).Msg("invalid configuration; nothing was changed on the host")
		return false
	}
	a.in = in
	// One API client for the repair controller and the pod socket.
	client, clientErr := repairClient(cfg)
	a.client = client
	// Linkerd pods' namespaces and the API server's ports, for the pod
	// socket's calls and repair in place (run by the pod socket).
	var linkerd *podcache.Watches
	if cfg.Linkerd.Enabled && clientErr == nil {
		linkerd = podcache.NewWatches(client)
	}
	repairer, hostNetns, err := hostRepair(cfg, linkerd)
	if err != nil {
		log.Error().Err(err).Msg("invalid repair configuration; nothing was changed on the host")
		return false
	}
	a.events = newPodEvents(cfg, client)
	if a.events != nil && repairer != nil {
		repairer = a.events.Repairer(repairer)
	}
	if cfg.Repair.Mode() != repair.None {
		err := clientErr
		if err == nil {
			a.repairCtl, err = repair.New(client, cfg.Repair, repairer, log, a.m)
		}
		if err != nil {
			log.Error().Err(err).Msg("invalid repair configuration; nothing was changed on the host")
			return false
		}
	}
	// Without the socket the plugin reads pods from the API itself, so a
	// socket that cannot be set up costs speed, not pod starts.
	a.sock, err = newPodSocket(cfg, client, a.repairCtl, linkerd, hostNetns, log, a.m, a.starved)
	if err != nil {
		log.Error().Err(err).Msg("setting up the pod socket; the plugin reads pods from the API itself")
		a.sock = nil
	}
	if a.sock != nil && a.events != nil {
		a.events.pods = a.sock.pods.GetIndexer()
	}
	if a.sock != nil && a.sock.cni != nil {
		a.sock.cni.Log, a.sock.cni.Decided = cniplugin.AgentLog(os.Stderr, cfg.LogLevel), a.decided
	}
	return true
}

// hostRepair wires in repair in place (the installer library imports no
// backend) and says whether the host's network namespace is known: it is
// registered to be refused only through the host's /proc.
func hostRepair(cfg *installer.Config, linkerd *podcache.Watches) (repair.PodRepairer, func() error, error) {
	if cfg.Repair.Mode() == repair.InPlace {
		opts := inplace.Options{
			ProcDir:           cfg.Repair.HostProc,
			Backend:           cfg.Backend,
			ExcludeNamespaces: cfg.ExcludeNamespaces,
			PodNamespace:      cfg.PodNamespace,
			RunDir:            cfg.AgentRunDir,
		}
		if cfg.Linkerd.Enabled {
			node := cfg.Linkerd.LinkerdConfig
			opts.Linkerd = &node
		}
		if linkerd != nil {
			opts.LinkerdFacts = linkerd
		}
		r, err := inplace.New(opts)
		if err != nil {
			return nil, nil, &installer.ConfigError{Flag: "host-proc", Value: cfg.Repair.HostProc, Reason: err.Error()}
		}
		return r, r.HostNetns, nil
	}
	if cfg.Repair.HostProc != "" {
		// Every other mode runs the plugin's calls and answers
		// `redirect inspect` too, when the host's /proc is mounted.
		_, err := capture.AddHostNetnsFromProc(cfg.Repair.HostProc)
		if err != nil {
			err = fmt.Errorf("registering the host's network namespace through %s: %w", cfg.Repair.HostProc, err)
		}
		return nil, func() error { return err }, nil
	}
	return nil, func() error {
		return errors.New("the host's network namespace is read only with repair in place (its host /proc)")
	}, nil
}

// serve starts the health and metrics servers (one when they share an
// address); false when one cannot listen.
func (a *agent) serve() bool {
	cfg := a.cfg
	health := metrics.HealthHandler(a.ready)
	if cfg.HealthAddr != "" && cfg.HealthAddr == cfg.MetricsAddr {
		mux := http.NewServeMux()
		mux.Handle("/metrics", a.m.Handler())
		mux.Handle("/", health)
		return a.listen(cfg.HealthAddr, mux, "health and metrics")
	}
	if cfg.HealthAddr != "" && !a.listen(cfg.HealthAddr, health, "health") {
		return false
	}
	return cfg.MetricsAddr == "" || a.listen(cfg.MetricsAddr, a.m.Handler(), "metrics")
}

// ready is /readyz: the plugin installed with a valid config (the
// installer's readiness, which also lifts the node's taint), and the agent
// not starved of what a CNI call needs (starvation).
func (a *agent) ready() error {
	if err := a.in.Ready(); err != nil {
		return err
	}
	return a.starved.check()
}

func (a *agent) listen(addr string, h http.Handler, what string) bool {
	s, err := metrics.Serve(addr, h)
	if err != nil {
		a.log.Error().Err(err).Msg("starting the " + what + " server")
		return false
	}
	a.log.Info().Str("addr", s.Addr.String()).Msg(what + " server listening")
	a.servers = append(a.servers, s)
	return true
}

func (a *agent) stopServers() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range a.servers {
		_ = s.Shutdown(ctx)
	}
}

// runUntilStopped runs the install loop until ctx ends (or the loop
// fails), alongside the plugin log's follower, the repair controller, the
// pod socket and the start observer; then it removes what the agent
// installed and waits for the others.
func (a *agent) runUntilStopped(ctx context.Context, stop func(), start time.Time) int {
	cfg, log := a.cfg, a.log
	// The standalone plugin's log file, surfaced in the agent's (kubectl
	// logs); the calls the agent runs log there themselves.
	plog := pluginlog.New(cfg.AgentRunDir, os.Stderr, cfg.LogLevel)
	plog.OnDecision = a.decided
	plogDone := goRun(func() error { return plog.Run(ctx) })
	repairDone := goRun(nil)
	if a.repairCtl != nil {
		repairDone = goRun(func() error { return a.repairCtl.Run(ctx) })
	}
	sockDone := goRun(nil)
	if a.sock != nil {
		sockDone = goRun(func() error { return a.sock.run(ctx) })
	} else {
		log.Info().Msg("no pod socket (needs an API client and --node-name): the plugin reads pods from the API itself")
	}
	untaintDone := make(chan struct{})
	go func() {
		defer close(untaintDone)
		observeStart(ctx, start, a.m, a.sock, canProgramPods(a.in, a.sock), func() {
			untaintNode(ctx, cfg, a.client, func() error { return nil }, log)
		})
	}()

	code := exitOK
	if err := a.in.Run(ctx); err != nil {
		log.Error().Err(err).Msg("install loop failed")
		code = exitFailed
		stop()
	}
	log.Info().Msg("shutting down: removing " + installer.PluginName + " from this node")
	if err := a.in.Cleanup(); err != nil {
		log.Error().Err(err).Msg("cleanup incomplete")
		code = exitFailed
	} else {
		log.Info().Msg("cleanup done")
	}
	if err := <-repairDone; err != nil {
		log.Error().Err(err).Msg("repair controller failed")
	}
	if err := <-sockDone; err != nil {
		log.Error().Err(err).Msg("pod socket failed; the plugin read pods from the API itself")
	}
	<-untaintDone
	if err := <-plogDone; err != nil {
		log.Warn().Err(err).Msg("following the plugin log failed; plugin lines stay in " + pluginlog.FileName + " only")
	}
	return code
}

// goRun runs f in a goroutine and hands back its error; a nil f is done
// at once.
func goRun(f func() error) <-chan error {
	done := make(chan error, 1)
	if f == nil {
		done <- nil
		return done
	}
	go func() { done <- f() }()
	return done
}

// answerLimits bound every answer the agent's API client reads: one
// answer without a bound (a 200 MB pod) took the agent's RSS from 37.7 to
// 275.7 MB, and a watch is a stream that lasts.
//   - One object (a pod, the node, an event written): 16 MiB, as the
//     plugin's client (podget) and apimachinery's bound on a protobuf watch
//     event. etcd refuses objects over 1.5 MiB unless told otherwise, and
//     the API server writes of over 3 MiB.
//   - A list: the node's pods are the largest answer the agent reads, and
//     the reflector's first list comes whole. The scale contract is 1,000
//     pods a node; an injected pod with its managed fields is 8 KiB in
//     protobuf, the encoding the agent asks for (1,000 such pods: 7.7 MiB).
//     64 MiB leaves 64 KiB a pod; the list is read a pod at a time
//     (repair.ReadSlimPodList, which also stops at repair.MaxListPods), so
//     the bound stops an endless answer rather than sizes a buffer. A list
//     in JSON, which the API server sends only when protobuf is not asked
//     for, is read whole: it gets the object's bound.
//   - A watch event: 16 MiB, as an object (apimachinery's own bound for
//     protobuf; the Guard's for JSON, which apimachinery reads whole).
var answerLimits = kubeconf.Limits{Object: 16 << 20, List: 64 << 20, Event: 16 << 20}

// repairClient talks to the API server as the agent's service account; the
// token file is re-read, so projected-token rotation needs nothing more.
func repairClient(cfg *installer.Config) (corev1client.CoreV1Interface, error) {
	if cfg.ServiceAccountDir == "" {
		return nil, errors.New("the repair controller needs --service-account-dir and an API server")
	}
	ca := cfg.KubeCAFile
	if ca == "" {
		ca = filepath.Join(cfg.ServiceAccountDir, "ca.crt")
	}
	rc := &rest.Config{
		Host:            cfg.KubeAPIServer,
		BearerTokenFile: filepath.Join(cfg.ServiceAccountDir, "token"),
		TLSClientConfig: rest.TLSClientConfig{CAFile: ca},
		UserAgent:       "nftmesh-agent",
		// No credential in an error or log line (a proxy that echoes the
		// request in its error page), no redirect followed with the token,
		// no answer read past its bound.
		WrapTransport: kubeconf.GuardLimits(answerLimits),
		// Pods in protobuf, as Kubernetes' own node components read them:
		// decoding the node's pod list from JSON allocated several times
		// the objects' size at once, and that peak is the agent's RSS.
		ContentConfig: rest.ContentConfig{
			ContentType:        "application/vnd.kubernetes.protobuf",
			AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json",
		},
	}
	c, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("building the repair controller's API client: %w", err)
	}
	return c, nil
}

// agentLogger is the agent's logger at level. client-go's klog output
// (watch errors, throttling notices) goes to it too, with
// "logger":"client-go", rather than as klog lines a log pipeline cannot
// parse. zerologr maps logr's V(0) to info and V(1) to debug; klog's own
// verbosity (0) still drops V(1) and up first.
func agentLogger(w io.Writer, format string, level zerolog.Level) zerolog.Logger {
	log := newLogger(w, format).Level(level)
	// ContextualLogger: klog.Background() and FromContext return this
	// logger itself, so WithName extends "logger" instead of adding a
	// second "logger" key.
	klog.SetLoggerWithOptions(zerologr.New(&log).WithName("client-go"), klog.ContextualLogger(true))
	return log
}

// newLogger writes JSON lines, or with format "text" plain lines without
// colour (Istio's agent writes text unless told to write JSON).
func newLogger(w io.Writer, format string) zerolog.Logger {
	if format == "text" {
		w = zerolog.ConsoleWriter{Out: w, NoColor: true, TimeFormat: time.RFC3339}
	}
	return zerolog.New(w).With().Timestamp().Str("component", "nftmesh-agent").Logger()
}
