// Package cluster is nftmesh's end-to-end test on a real single-node
// Kubernetes cluster, run the way users run it: Kubernetes v1.35.4 (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
// kube-proxy) on Debian's containerd and runc, the project's image imported
// into containerd, the chart installed with helm, pods started by kubelet
// through the CNI chain (bridge + host-local, then nftmesh-cni).
//
// The whole node lives in one private network and mount namespace held by a
// "holder" process; every component is started into it with nsenter. The
// machine's root network namespace, its mounts and its kernel sysctls are
// never changed: the few global sysctls kubelet writes are shadowed by bind
// mounts inside the holder's mount namespace, kube-proxy is told to leave
// conntrack alone, and the node's /run and /var are private there. TestMain
// brings the cluster up once for all tests and tears it down again (also on
// failure, Ctrl-C, SIGTERM and the test timeout), then checks that no
// process, mount, cgroup or network namespace of it is left.
//
// The last test, TestMultiNode, adds nodes to the same cluster (AddNodes):
// each a holder of its own with containerd, kubelet and kube-proxy, linked
// to the first node's namespace by a veth, and takes them out again
// (RemoveNode), checking the same way that nothing of them is left.
//
// It has no non-test code. It needs root and skips without it; missing
// binaries (make e2e-cluster builds them) skip it too, except under CI=true,
// where they fail it.
package cluster
