package podget

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"k8s.io/client-go/rest"

	"github.com/nftmesh/nftmesh/internal/kubeconf"
	"github.com/nftmesh/nftmesh/redirect/quote"
)

// The two reads a Linkerd pod's decision may need when the agent cannot
// answer (linkerd-cni makes them on every ADD): one attempt each, within
// timeout, as linkerd-cni's.

// NamespaceAnnotations reads the annotations of namespace name (a watch
// cache read). A namespace without annotations gives an empty, non-nil map.
func (c *Client) NamespaceAnnotations(ctx context.Context, name string, timeout time.Duration) (map[string]string, error) {
	var ns struct {
		Metadata struct {
			Name        string            `json:"name"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := c.getJSON(ctx, c.rc.Get().Resource("namespaces").Name(name), timeout, &ns); err != nil {
		return nil, &Error{msg: kubeconf.Redact(fmt.Sprintf("getting namespace %s: %v", quote.Value(name), err), c.secrets...), err: err}
	}
	if ns.Metadata.Name != name {
		return nil, fmt.Errorf("getting namespace %s: the API server answered with namespace %s", quote.Value(name), quote.Value(ns.Metadata.Name))
	}
	if ns.Metadata.Annotations == nil {
		return map[string]string{}, nil
	}
	return ns.Metadata.Annotations, nil
}

// APIServerPorts reads the default/kubernetes Service's ports and numeric
// target ports, which a Linkerd control plane pod does not capture.
func (c *Client) APIServerPorts(ctx context.Context, timeout time.Duration) ([]string, error) {
	var svc struct {
		Spec struct {
			Ports []struct {
				Port       int32           `json:"port"`
				TargetPort json.RawMessage `json:"targetPort"`
			} `json:"ports"`
		} `json:"spec"`
	}
	req := c.rc.Get().Namespace("default").Resource("services").Name("kubernetes")
	if err := c.getJSON(ctx, req, timeout, &svc); err != nil {
		return nil, &Error{msg: kubeconf.Redact("getting service default/kubernetes: "+err.Error(), c.secrets...), err: err}
	}
	var out []string
	for _, p := range svc.Spec.Ports {
		out = append(out, strconv.Itoa(int(p.Port)))
		// A named target port is a string and is left out, as in linkerd-cni.
		var n int32
		if json.Unmarshal(p.TargetPort, &n) == nil {
			out = append(out, strconv.Itoa(int(n)))
		}
	}
	return out, nil
}

// getJSON makes one GET (a watch cache read) and decodes its JSON answer.
func (c *Client) getJSON(ctx context.Context, req *rest.Request, timeout time.Duration, into any) error {
	ctx, cancel := context.WithTimeout(ctx, max(timeout, time.Millisecond))
	defer cancel()
	res := req.Param("resourceVersion", "0").MaxRetries(0).Do(ctx)
	if err := res.Error(); err != nil {
		return explain(err)
	}
	body, _ := res.Raw()
	var ctype string
	res.ContentType(&ctype)
	if !isJSON(ctype) {
		return fmt.Errorf("the API server answered with content type %s, not JSON", quote.Value(ctype))
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("decoding the answer: %s", quote.Text(err.Error()))
	}
	return nil
}
