package hostns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

func TestRefuse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a netns")
	}
	if err := Refuse("/proc/self/ns/net"); !errors.Is(err, ErrOwnNetns) {
		t.Errorf("Refuse(own netns) = %v, want ErrOwnNetns", err)
	}
	if err := Refuse(fmt.Sprintf("/proc/%d/ns/net", os.Getpid())); !errors.Is(err, ErrOwnNetns) {
		t.Errorf("Refuse(/proc/PID/ns/net of self) = %v, want ErrOwnNetns", err)
	}
	AllowOwn = true
	if err := Refuse("/proc/self/ns/net"); err != nil {
		t.Errorf("AllowOwn: Refuse(own netns) = %v", err)
	}
	AllowOwn = false
	name := fmt.Sprintf("hns-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", name).Run()
	if err := Refuse("/run/netns/" + name); err != nil {
		t.Errorf("Refuse(fresh netns) = %v", err)
	}
	if err := Refuse("/run/netns/does-not-exist"); err != nil {
		t.Errorf("missing path should be left to the backend, got %v", err)
	}
}
