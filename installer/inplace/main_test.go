package inplace

import "runtime"

// nettest's listeners and netlink handles enter pod namespaces from locked
// threads; keeping the main goroutine on the main thread stops one of them
// from being the main thread, whose namespace /proc/self/ns/net shows and
// the backends' host-namespace guard compares against.
func init() { runtime.LockOSThread() }
