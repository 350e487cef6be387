package podinfo

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/nftmesh/nftmesh/podinfo/meshpod"
	"github.com/nftmesh/nftmesh/redirect"
)

// FromPod is meshpod.Decide of pod.
func FromPod(pod *corev1.Pod) (inMesh bool, reason string, spec redirect.Spec, err error) {
	if pod == nil {
		return meshpod.Decide(nil)
	}
	return meshpod.Decide(Mesh(pod))
}

// Mesh copies the fields the in-mesh decision reads out of pod.
func Mesh(pod *corev1.Pod) *meshpod.Pod {
	p := &meshpod.Pod{
		Namespace:      pod.Namespace,
		Name:           pod.Name,
		Labels:         pod.Labels,
		Annotations:    pod.Annotations,
		InitContainers: containers(pod.Spec.InitContainers),
		Containers:     containers(pod.Spec.Containers),
	}
	if pod.Status.PodIP != "" {
		p.PodIPs = append(p.PodIPs, pod.Status.PodIP)
	}
	for _, ip := range pod.Status.PodIPs {
		p.PodIPs = append(p.PodIPs, ip.IP)
	}
	return p
}

func containers(cs []corev1.Container) []meshpod.Container {
	var out []meshpod.Container
	for _, c := range cs {
		mc := meshpod.Container{Name: c.Name, Args: c.Args}
		for _, e := range c.Env {
			mc.Env = append(mc.Env, meshpod.EnvVar{Name: e.Name, Value: e.Value})
		}
		if sc := c.SecurityContext; sc != nil {
			mc.RunAsUser, mc.RunAsGroup = sc.RunAsUser, sc.RunAsGroup
		}
		out = append(out, mc)
	}
	return out
}
