package repair

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
)

// SlimPod is the node pod informer's transform: it keeps of a pod only what
// the agent reads (the broken-pod test, the delete/label preconditions,
// repair in place, the in-mesh decision and capture spec). An injected
// pod's managed fields, volumes, probes, resources and mounts are most of
// its size, and the agent holds every pod of its node, so this is most of
// its memory on a full node. Anything else (a tombstone) is unchanged.
func SlimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:              pod.Name,
			Namespace:         pod.Namespace,
			UID:               pod.UID,
			ResourceVersion:   pod.ResourceVersion,
			Generation:        pod.Generation,
			CreationTimestamp: pod.CreationTimestamp,
			DeletionTimestamp: pod.DeletionTimestamp,
			Labels:            pod.Labels,
			Annotations:       pod.Annotations,
			OwnerReferences:   pod.OwnerReferences,
		},
		Spec: corev1.PodSpec{
			NodeName:       pod.Spec.NodeName,
			HostNetwork:    pod.Spec.HostNetwork,
			InitContainers: slimContainers(pod.Spec.InitContainers),
			Containers:     slimContainers(pod.Spec.Containers),
		},
		Status: corev1.PodStatus{
			Phase:                 pod.Status.Phase,
			PodIP:                 pod.Status.PodIP,
			PodIPs:                pod.Status.PodIPs,
			InitContainerStatuses: slimStatuses(pod.Status.InitContainerStatuses),
		},
	}
	return out, nil
}

// slimContainers keeps what the in-mesh decision reads: every container's
// name and restart policy (a native sidecar), and of the proxy's its args,
// env names and literal values, and user and group. An application's args
// and env, often the bulk of it, are read by nothing in the agent.
func slimContainers(cs []corev1.Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy}
		if c.Name != meshpod.ProxyContainer {
			continue
		}
		out[i].Args = c.Args
		if c.Env != nil {
			// valueFrom is dropped: the decision reads literal values only.
			out[i].Env = make([]corev1.EnvVar, len(c.Env))
			for j, e := range c.Env {
				out[i].Env[j] = corev1.EnvVar{Name: e.Name, Value: e.Value}
			}
		}
		if sc := c.SecurityContext; sc != nil && (sc.RunAsUser != nil || sc.RunAsGroup != nil) {
			out[i].SecurityContext = &corev1.SecurityContext{RunAsUser: sc.RunAsUser, RunAsGroup: sc.RunAsGroup}
		}
	}
	return out
}

// slimStatuses keeps what the broken-pod test reads of init containers.
func slimStatuses(ss []corev1.ContainerStatus) []corev1.ContainerStatus {
	if ss == nil {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(ss))
	for i, s := range ss {
		out[i] = corev1.ContainerStatus{Name: s.Name, State: s.State, LastTerminationState: s.LastTerminationState, ContainerID: s.ContainerID}
	}
	return out
}

// listPageSize is how many pods one list request asks for.
const listPageSize = 100

// ListSlimPods lists pods with o, a page of listPageSize at a time, and
// slims each page before asking for the next: a thousand injected pods in
// one answer took about 50 MiB at once (body, copy, decoded pods) for
// 4 MiB of slimmed pods kept. A continued list is one request.
//
// The version asked for is kept. The reflector lists first at "0" (any
// version), which the API server answers whole from its watch cache's
// index of pods by node. It must not become a most-recent read (""): the
// agent lists only where the server does not stream lists, and there such
// a read is served from etcd (before Kubernetes 1.31, or etcd below
// 3.4.31/3.5.13), which filters by node only after reading every pod of
// the cluster: e2e/bench BenchmarkScaleContract measured 4,000 pods read
// per agent start in a 4,000-pod cluster.
func ListSlimPods(ctx context.Context, list func(context.Context, metav1.ListOptions) (*corev1.PodList, error), o metav1.ListOptions) (*corev1.PodList, error) {
	paged := o.Continue == ""
	if paged {
		o.Limit = listPageSize
	}
	var out *corev1.PodList
	for {
		page, err := list(ctx, o)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = &corev1.PodList{TypeMeta: page.TypeMeta, ListMeta: page.ListMeta, Items: make([]corev1.Pod, 0, len(page.Items))}
		}
		for i := range page.Items {
			slim, _ := SlimPod(&page.Items[i])
			out.Items = append(out.Items, *slim.(*corev1.Pod))
		}
		if !paged || page.Continue == "" {
			out.Continue = page.Continue
			out.RemainingItemCount = page.RemainingItemCount
			return out, nil
		}
		o.Continue = page.Continue
		// The continue token pins the version; the server refuses one
		// beside it.
		o.ResourceVersion, o.ResourceVersionMatch = "", ""
	}
}
