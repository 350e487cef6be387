package cluster

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// coreDNSImage is CoreDNS built from the module proxy (make
// conformance-images), imported on every node.
const coreDNSImage = "localhost/coredns:e2e"

// coreDNSManifest is the cluster DNS as kubeadm deploys it (ServiceAccount,
// RBAC, Corefile, Deployment, the kube-dns Service at clusterDNSIP), with
// the image swapped for the offline one and no upstream to forward to: the
// rig reaches no outside resolver, and no conformance spec resolves a name
// outside the cluster.
const coreDNSManifest = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes ` + clusterDomain + ` in-addr.arpa ip6.arpa {
           pods insecure
           fallthrough in-addr.arpa ip6.arpa
           ttl 30
        }
        cache 30
        loop
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      # On the first node, which is never taken out before the rig stops.
      nodeSelector: {kubernetes.io/hostname: ` + nodeName + `}
      priorityClassName: system-cluster-critical
      containers:
      - name: coredns
        image: ` + coreDNSImage + `
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
        ports:
        - {containerPort: 53, name: dns, protocol: UDP}
        - {containerPort: 53, name: dns-tcp, protocol: TCP}
        livenessProbe: {httpGet: {path: /health, port: 8080}, initialDelaySeconds: 60, timeoutSeconds: 5}
        readinessProbe: {httpGet: {path: /ready, port: 8181}}
      volumes:
      - name: config
        configMap: {name: coredns, items: [{key: Corefile, path: Corefile}]}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: ` + clusterDNSIP + `
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
`

// deployCoreDNS applies coreDNSManifest and waits for CoreDNS to be ready.
func (c *Cluster) deployCoreDNS(ctx context.Context) error {
	file := c.path("conformance", "coredns.yaml")
	if err := writeFile(file, coreDNSManifest, 0o644); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "-f", file); err != nil {
		return err
	}
	var dep *appsv1.Deployment
	err := c.poll(ctx, 3*time.Minute, "CoreDNS ready", func() (bool, error) {
		var err error
		dep, err = c.Client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		return err == nil && dep.Status.ReadyReplicas == 1, nil
	})
	if err != nil {
		out, _ := c.Kubectl(ctx, "-n", "kube-system", "describe", "pods", "-l", "k8s-app=kube-dns")
		return fmt.Errorf("%w\n%s", err, out)
	}
	return nil
}
