package installer

import (
	"io/fs"
	"os"
	"syscall"

	"github.com/nftmesh/nftmesh/internal/atomicfile"
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
