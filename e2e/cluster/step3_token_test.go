package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// tokenRotation is what phase (c) of the churn test saw: the agent's
// ServiceAccount recreated (every token it had invalid) and the agent
// killed without its clean-up (entry and kubeconfig left on the node, so
// the front's fallback, the standalone plugin, serves ADDs with the
// kubeconfig's dead token) and its pod force-deleted, until the new agent
// rewrote the kubeconfig.
type tokenRotation struct {
	invalid   time.Time     // the ServiceAccount deleted: the old token stops working
	down      time.Time     // the agent killed
	rewritten time.Duration // from invalid until the node's kubeconfig held another token
	ready     time.Duration // from down until the new agent was Ready
	newPod    string
	oldToken  string
}

// nodeKubeconfigToken reads the token of the plugin's kubeconfig on the node.
func (c *Cluster) nodeKubeconfigToken() (string, error) {
	kc, err := clientcmd.LoadFromFile(filepath.Join(c.NodePath(agentRunDirOnNode), "kubeconfig"))
	if err != nil {
		return "", err
	}
	for _, a := range kc.AuthInfos {
		if a.Token != "" {
			return a.Token, nil
		}
	}
	return "", fmt.Errorf("no token in the node's kubeconfig")
}

// agentPID finds the one nftmesh-agent process of the node: by its name,
// among the processes in the node's cgroups (the agent's container has
// namespaces of its own, and other clusters on the machine run agents too).
func (c *Cluster) agentPID() (int, error) {
	var found []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != "nftmesh-agent" {
			continue
		}
		cg, err := os.ReadFile("/proc/" + e.Name() + "/cgroup")
		if err == nil && strings.Contains(string(cg), ":/"+c.cgroupName+"/") {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("nftmesh-agent processes in the node's cgroup %s: %v, want one", c.cgroupName, found)
	}
	return found[0], nil
}

// rotateTokenAgentDown recreates the agent's ServiceAccount (the old
// token, the one the node's kubeconfig holds, stops authenticating), kills
// the agent process at once (SIGKILL: no clean-up, as an OOM kill or a
// crash) and force-deletes its pod, then waits for the new agent to rewrite
// the kubeconfig and turn Ready on image. whileDown runs right after the
// kill.
func (c *Cluster) rotateTokenAgentDown(ctx context.Context, image string, whileDown func()) (*tokenRotation, error) {
	r := &tokenRotation{}
	var err error
	if r.oldToken, err = c.nodeKubeconfigToken(); err != nil {
		return nil, err
	}
	old, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
	if err != nil || len(old.Items) != 1 {
		return nil, fmt.Errorf("agent pods: %v (%d)", err, len(old.Items))
	}
	pid, err := c.agentPID()
	if err != nil {
		return nil, err
	}
	sas := c.Client.CoreV1().ServiceAccounts(agentNS)
	sa, err := sas.Get(ctx, agentDaemonSet, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	r.invalid = time.Now()
	if err := sas.Delete(ctx, sa.Name, metav1.DeleteOptions{}); err != nil {
		return nil, err
	}
	// The same object (helm's labels and annotations) with a new UID.
	fresh := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa.Name, Namespace: sa.Namespace,
		Labels: sa.Labels, Annotations: sa.Annotations}, ImagePullSecrets: sa.ImagePullSecrets}
	if _, err := sas.Create(ctx, fresh, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	r.down = time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return nil, fmt.Errorf("killing the agent (pid %d): %w", pid, err)
	}
	zero := int64(0)
	if err := c.Client.CoreV1().Pods(agentNS).Delete(ctx, old.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return nil, err
	}
	whileDown()
	err = c.poll(ctx, 120*time.Second, "the node's kubeconfig rewritten with another token", func() (bool, error) {
		tok, err := c.nodeKubeconfigToken()
		return err == nil && tok != r.oldToken, nil
	})
	if err != nil {
		// Likely the new agent's own pod could not start (its sandbox
		// refused by the plugin with the stale token).
		var described []string
		if l, lerr := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"}); lerr == nil {
			for _, p := range l.Items {
				described = append(described, c.describePod(ctx, agentNS, p.Name))
			}
		}
		return nil, fmt.Errorf("%w; agent pods:\n%s", err, strings.Join(described, "\n"))
	}
	r.rewritten = time.Since(r.invalid)
	if err := c.waitAgentImage(ctx, image, old.Items[0].Name); err != nil {
		return nil, err
	}
	r.ready = time.Since(r.down)
	l, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftmesh-agent"})
	if err != nil || len(l.Items) != 1 {
		return nil, fmt.Errorf("agent pods: %v (%d)", err, len(l.Items))
	}
	r.newPod = l.Items[0].Name
	return r, nil
}

// whoAmI asks the API server whose token tok is: the user, and the pod a
// pod-bound token names ("" for none). An error for a token it refuses.
func (c *Cluster) whoAmI(ctx context.Context, tok string) (user, pod string, err error) {
	cfg, err := c.restConfig(tok)
	if err != nil {
		return "", "", err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", "", err
	}
	rev, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", "", err
	}
	if v := rev.Status.UserInfo.Extra["authentication.kubernetes.io/pod-name"]; len(v) == 1 {
		pod = v[0]
	}
	return rev.Status.UserInfo.Username, pod, nil
}

// pluginLine is the part of a plugin decision line the churn test and the
// chain timings read.
type pluginLine struct {
	Time       time.Time `json:"time"`
	Component  string    `json:"component"`
	Command    string    `json:"command"`
	Pod        string    `json:"pod"`
	Decision   string    `json:"decision"`
	Error      string    `json:"error"`
	RanBy      string    `json:"ran_by"`
	Lookup     string    `json:"lookup"`
	DurationMS float64   `json:"duration_ms"`
}

// pluginLines reads the decision lines of pods whose name starts with
// prefix: the standalone plugin's in the node's plugin log (and its
// rotated part), those of the calls the agent ran in the logs of the agent
// pods there are now (they write no file).
func (c *Cluster) pluginLines(prefix string) ([]pluginLine, error) {
	out, err := c.agentRunLines(prefix)
	if err != nil {
		return nil, err
	}
	base := filepath.Join(c.NodePath(agentRunDirOnNode), "nftmesh-cni.log")
	for _, f := range []string{base + ".1", base} {
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			var l pluginLine
			if json.Unmarshal(sc.Bytes(), &l) != nil || l.Decision == "" || !strings.HasPrefix(l.Pod, prefix) {
				continue
			}
			out = append(out, l)
		}
	}
	return out, nil
}

// agentRunLines reads the agent pods' logs for the decision lines of the
// calls they ran, of pods whose name starts with prefix.
func (c *Cluster) agentRunLines(prefix string) ([]pluginLine, error) {
	ctx := context.Background()
	pods, err := c.Client.CoreV1().Pods(agentNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []pluginLine
	for _, p := range pods.Items {
		raw, err := c.Client.CoreV1().Pods(agentNS).GetLogs(p.Name, &corev1.PodLogOptions{Container: "agent"}).DoRaw(ctx)
		if err != nil {
			continue // not started yet, or gone
		}
		for _, line := range strings.Split(string(raw), "\n") {
			var l pluginLine
			if json.Unmarshal([]byte(line), &l) == nil && l.Component == "cni-plugin" && l.RanBy == "agent" && l.Decision != "" && strings.HasPrefix(l.Pod, prefix) {
				out = append(out, l)
			}
		}
	}
	return out, nil
}

// checkTokenRotation asserts phase (c) of the churn test: the old token
// really stopped working, the node's kubeconfig now holds the new agent
// pod's token, ADDs failed Unauthorized only between the ServiceAccount's
// deletion and the kubeconfig's rewrite, and the standalone plugin served
// ADDs while the agent was down (else the phase tested nothing).
func (c *Cluster) checkTokenRotation(ctx context.Context, t *testing.T, r *tokenRotation) {
	if _, _, err := c.whoAmI(ctx, r.oldToken); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("the old kubeconfig token still authenticates (%v): the rotation was not real", err)
	}
	tok, err := c.nodeKubeconfigToken()
	if err != nil {
		t.Errorf("the node's kubeconfig: %v", err)
		return
	}
	user, pod, err := c.whoAmI(ctx, tok)
	if want := "system:serviceaccount:" + agentNS + ":" + agentDaemonSet; err != nil || user != want || pod != r.newPod {
		t.Errorf("the node's kubeconfig token is %q of pod %q (%v), want %q of the new agent pod %q", user, pod, err, want, r.newPod)
	}
	lines, err := c.pluginLines("churn-")
	if err != nil {
		t.Errorf("reading the plugin log: %v", err)
		return
	}
	rewritten := r.invalid.Add(r.rewritten)
	// A call that read the old kubeconfig just before the rewrite may
	// log its failure a moment after it.
	const slack = 2 * time.Second
	var unauthorized, standalone, late int
	var lastUnauthorized time.Time
	for _, l := range lines {
		if l.Command != "ADD" {
			continue
		}
		if l.RanBy == "standalone" && !l.Time.Before(r.down) && !l.Time.After(rewritten.Add(slack)) {
			standalone++
		}
		if l.Decision != "error" || !strings.Contains(l.Error, "Unauthorized") {
			continue
		}
		unauthorized++
		if l.Time.After(lastUnauthorized) {
			lastUnauthorized = l.Time
		}
		if l.Time.Before(r.invalid.Add(-slack)) || l.Time.After(rewritten.Add(slack)) {
			late++
			t.Errorf("ADD of %s failed Unauthorized at %s, outside the rotation (token invalid %s, kubeconfig rewritten %s): %s",
				l.Pod, l.Time.Format(time.StampMilli), r.invalid.Format(time.StampMilli), rewritten.Format(time.StampMilli), l.Error)
		}
	}
	// The new agent's own pod started while the kubeconfig was stale:
	// the plugin lets it through before any API call (istio/istio#57438:
	// Istio's plugin failed it Unauthorized until a hand edit).
	own, err := c.pluginLines(r.newPod)
	if err != nil {
		t.Errorf("reading the plugin log: %v", err)
	}
	ownOK := 0
	for _, l := range own {
		switch {
		case l.Command != "ADD":
		case l.Decision == "error":
			t.Errorf("ADD of the new agent pod %s failed: %s", r.newPod, l.Error)
		default:
			ownOK++
		}
	}
	if ownOK == 0 {
		t.Errorf("no ADD line for the new agent pod %s in the plugin log: %+v", r.newPod, own)
	}
	if standalone == 0 {
		t.Errorf("the standalone plugin ran no ADD between the agent's kill and the kubeconfig's rewrite: the stale token was not exercised")
	}
	last := "none"
	if unauthorized > 0 {
		last = fmt.Sprintf("the last %.2fs after the token went invalid", lastUnauthorized.Sub(r.invalid).Seconds())
	}
	record("churn: token rotated (ServiceAccount recreated, agent SIGKILLed and its pod force-deleted): node kubeconfig rewritten %.2fs after, new agent Ready %.2fs; %d ADDs by the standalone plugin meanwhile, %d failed Unauthorized (%s), %d outside the window",
		r.rewritten.Seconds(), r.ready.Seconds(), standalone, unauthorized, last, late)
}
