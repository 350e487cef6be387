// Package oneproc sets GOMAXPROCS to 1 while the process initialises, for
// a short-lived command that runs one goroutine at a time (the redirect
// CLI): a binary gets it by importing the package, for its side effect.
// It owns nothing else.
//
// With a second P the runtime wakes an idle thread at every goroutine it
// starts or readies, and the thread, finding nothing to do, spins and goes
// back to sleep; package initialisation already starts some (os's
// finalizer and cleanup goroutines, unique's cleanup for net/netip), and a
// verb starts or readies more (a netns entry, the batch prepared ahead of
// the lock, each netpoll registration and deadline). Each wake-up is a
// thread switch, each new thread its stacks' page faults, and on a loaded
// machine a wait for a CPU. Measured on `redirect apply` under nsenter,
// 200 rounds alternating with and without, three runs at load 17-60: CPU
// per run -4.1 to -4.5 ms (-10%), 55-58 page faults and 45-66 context
// switches fewer. Set from main instead, it comes too late for the
// initialisation's goroutines and their threads (-1.8 ms CPU, no fewer
// threads).
//
// Package initialisation goes in import path order among the packages
// whose imports are initialised (the Go spec); this one imports only the
// runtime, so it comes ahead of os and of every package that starts a
// goroutine (TestInitialisedBeforeOS). The runtime's own start-up
// goroutines run before any package, with the runtime's GOMAXPROCS.
package oneproc

import "runtime"

// Procs is GOMAXPROCS as the runtime chose it, before this package set it
// to 1: what a test binary gives back to run its tests in parallel.
var Procs = runtime.GOMAXPROCS(1)
