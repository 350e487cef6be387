// Command kubefloor is the floor of a plugin process that looks a pod up
// with client-go, as the standalone plugin does: the runtime and package
// start of k8s.io/client-go's rest and clientcmd, the kubeconfig read, one
// GET. It does nothing else (no CNI, no netns, no rules). BenchmarkBurst
// starts it as many times at once as it starts plugins.
//
//	kubefloor KUBECONFIG NAMESPACE NAME
package main

import (
	"context"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: kubefloor KUBECONFIG NAMESPACE NAME")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg.ContentType = "application/json"
	cfg.APIPath, cfg.GroupVersion = "/api", &schema.GroupVersion{Version: "v1"}
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(runtime.NewScheme()).WithoutConversion()
	c, err := rest.RESTClientFor(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, err := c.Get().AbsPath("/api/v1/namespaces", os.Args[2], "pods", os.Args[3]).DoRaw(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
