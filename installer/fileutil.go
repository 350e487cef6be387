package installer

import (
	"io/fs"
	"os"
	"syscall"

	"github.com/nftmesh/nftmesh/internal/atomicfile"
)

// Temp file naming is atomicfile's, so leftovers of any of our writers are
// recognised.
const (
	tmpPrefix = atomicfile.TempPrefix
	tmpSuffix = atomicfile.TempSuffix
)

// writeFileAtomic replaces path with data durably; uid/gid >= 0 are applied
// too, so a rewritten file keeps its owner.
func writeFileAtomic(path string, data []byte, mode fs.FileMode, uid, gid int) error {
	return atomicfile.Write(path, data, mode, atomicfile.Options{Sync: true, Chown: true, UID: uid, GID: gid})
}

// fileOwner returns a file's mode and owner, or defaults when it does not exist.
func fileOwner(path string, def fs.FileMode) (fs.FileMode, int, int) {
	fi, err := os.Stat(path)
	if err != nil {
		return def, -1, -1
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fi.Mode().Perm(), int(st.Uid), int(st.Gid)
	}
	return fi.Mode().Perm(), -1, -1
}

// removeLeftovers deletes temp files an interrupted write of ours left in dir.
func removeLeftovers(dir string) error { return atomicfile.RemoveLeftovers(dir) }

func isOurTemp(name string) bool { return atomicfile.IsTemp(name) }
