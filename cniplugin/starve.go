package cniplugin

import (
	"golang.org/x/sys/unix"

	"github.com/nftmesh/nftmesh/podinfo/agentsock"
)

// StarvedOf names the resource whose lack err reports, or "" (see
// agentsock.StarvedOf: ResourceFDs, ResourceMemory, ResourceBuffers).
func StarvedOf(err error) string { return agentsock.StarvedOf(err) }

// fdProbe opens and closes one descriptor: nil when this process can open
// one now, else why not.
func fdProbe() error {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}
