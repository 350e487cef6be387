//go:debug updatemaxprocs=0

package main

// updatemaxprocs=0: the runtime otherwise starts, before any package's
// init, a goroutine that re-reads the cgroup CPU limit every second to
// update GOMAXPROCS. A verb lives for milliseconds and main sets GOMAXPROCS
// itself (which stops those updates anyway), so that goroutine only costs
// a thread wake-up at start-up, measurable in a whole process's wall time.
