package standin

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/nftmesh/nftmesh/redirect/quote"
)

// Targets is a repeatable flag of dial targets; each value may also hold a
// comma-separated list.
type Targets []Target

func (t *Targets) String() string {
	s := make([]string, len(*t))
	for i, x := range *t {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

// Set adds the targets in v.
func (t *Targets) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		x, err := ParseTarget(s)
		if err != nil {
			return err
		}
		*t = append(*t, x)
	}
	return nil
}

// Ports is a repeatable flag of TCP ports; each value may also hold a
// comma-separated list.
type Ports []uint16

func (p *Ports) String() string {
	s := make([]string, len(*p))
	for i, x := range *p {
		s[i] = strconv.Itoa(int(x))
	}
	return strings.Join(s, ",")
}

// Set adds the ports in v.
func (p *Ports) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("port %s is not a number from 1 to 65535", quote.ValueN(s, 20))
		}
		*p = append(*p, uint16(n))
	}
	return nil
}

// SignalContext is canceled by SIGTERM or SIGINT: how kubelet stops a
// container. Stand-ins exit 0 then, as a well-behaved container does.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

// Fatal prints err on stderr and exits 2: a stand-in that cannot do its
// job must make its container fail, visibly.
func Fatal(prog string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
	os.Exit(2)
}
