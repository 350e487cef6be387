package cluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// agentLogs follows the log of every agent pod that appears while it runs,
// each into its own file under dir: a replaced agent's log is gone from the
// API with its pod, and it is what explains a pod that was not repaired.
type agentLogs struct {
	dir    string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	files map[string]string // pod name → log file
}

func (c *Cluster) followAgentLogs(dir string) (*agentLogs, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &agentLogs{dir: dir, cancel: cancel, files: map[string]string{}}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			l, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
			if err == nil {
				for _, p := range l.Items {
					a.mu.Lock()
					_, seen := a.files[p.Name]
					file := filepath.Join(dir, p.Name+".log")
					if !seen {
						a.files[p.Name] = file
					}
					a.mu.Unlock()
					if !seen {
						a.wg.Add(1)
						go func(name string) { defer a.wg.Done(); c.streamLog(ctx, name, file) }(p.Name)
					}
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return a, nil
}

// streamLog copies the agent pod's log into file from its start until the
// container ends or ctx does; it retries while the container is not up yet.
func (c *Cluster) streamLog(ctx context.Context, pod, file string) {
	f, err := os.Create(file)
	if err != nil {
		return
	}
	defer f.Close()
	for ctx.Err() == nil {
		rc, err := c.Client.CoreV1().Pods(agentNS).GetLogs(pod, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
		if err == nil {
			_, _ = io.Copy(f, rc)
			rc.Close()
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop ends every stream and returns the agent logs (by pod) read so far.
func (a *agentLogs) stop() map[string]string {
	a.cancel()
	a.wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]string{}
	for name, file := range a.files {
		b, _ := os.ReadFile(file)
		out[name] = string(b)
	}
	return out
}

// linesAbout returns the lines of every agent log that name pod.
func linesAbout(logs map[string]string, pod string) string {
	var sb strings.Builder
	for name, l := range logs {
		for _, line := range strings.Split(l, "\n") {
			if strings.Contains(line, `"`+pod+`"`) {
				fmt.Fprintf(&sb, "  [%s] %s\n", name, line)
			}
		}
	}
	return sb.String()
}

// describePod is what an operator would look at for a stuck pod: its
// status and events (kubectl describe).
func (c *Cluster) describePod(ctx context.Context, ns, name string) string {
	out, err := c.Kubectl(ctx, "-n", ns, "describe", "pod", name)
	if err != nil {
		return err.Error()
	}
	return out
}

// agentMetrics returns the repair lines of the running agent's metrics.
func (c *Cluster) agentMetrics(ctx context.Context) (string, error) {
	l, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
	if err != nil || len(l.Items) == 0 {
		return "", fmt.Errorf("listing agent pods: %v", err)
	}
	b, err := c.Client.CoreV1().Pods(agentNS).ProxyGet("http", l.Items[0].Name, "15014", "metrics", nil).DoRaw(ctx)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "repair") && !strings.HasPrefix(line, "#") {
			sb.WriteString(line + "\n")
		}
	}
	return sb.String(), nil
}
