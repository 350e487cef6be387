package agentsock

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nftmesh/nftmesh/testkit/syncbuf"
)

// dialEnv makes the test binary a peer that connects to the socket at its
// value and stays until the server hangs up.
const dialEnv = "AGENTSOCK_TEST_DIAL"

func dialAndWait(path string) {
	c, err := net.Dial("unix", path)
	if err != nil {
		os.Exit(2)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	_, _ = c.Read(b[:])
	os.Exit(0)
}

// TestCheckAdminPeer: a peer passes only as root holding CAP_NET_ADMIN in
// the initial user namespace. Root stripped of every capability, root
// without CAP_NET_ADMIN alone, and root of a user namespace of its own
// (every capability, there) are refused.
func TestCheckAdminPeer(t *testing.T) {
	needRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		wrap []string // the command the peer runs under
		ok   bool
	}{
		{"root with its capabilities", nil, true},
		{"root without any capability", []string{"setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--"}, false},
		{"root without CAP_NET_ADMIN", []string{"setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-net_admin", "--"}, false},
		{"root of its own user namespace", []string{"unshare", "--user", "--map-root-user", "--"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.wrap) > 0 {
				if _, err := exec.LookPath(tt.wrap[0]); err != nil {
					t.Skipf("skipping: %s not installed (util-linux)", tt.wrap[0])
				}
			}
			path := filepath.Join(t.TempDir(), "peer.sock")
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			args := append(append([]string{}, tt.wrap...), self)
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Env = []string{dialEnv + "=" + path}
			out := &syncbuf.Buffer{}
			cmd.Stdout, cmd.Stderr = out, out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := cmd.Wait(); err != nil {
					t.Errorf("peer: %v %s", err, out)
				}
			}()
			_ = l.SetDeadline(time.Now().Add(10 * time.Second))
			c, err := l.AcceptUnix()
			if err != nil {
				t.Fatalf("accepting the peer: %v %s", err, out)
			}
			defer c.Close()
			err = CheckAdminPeer(c, "/proc")
			if tt.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tt.ok && err == nil {
				t.Fatal("accepted")
			}
			t.Logf("%v", err)
		})
	}
}
