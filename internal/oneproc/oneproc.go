// Package oneproc sets GOMAXPROCS to 1 while the process initialises, for
// a short-lived command that runs one goroutine at a time (the redirect
// CLI): a binary gets it by importing the package, for its side effect.
// It owns nothing else.
//
// With a second P the runtime wakes an idle thread at every goroutine it
// starts or readies (package initialisation starts some, a verb more), and
// the thread, finding nothing to do, spins and sleeps again: a thread
// switch, new stacks' page faults, on a loaded machine a wait for a CPU.
// Measured on `redirect apply`, 200 rounds alternating with and without,
// three runs at load 17-60: CPU per run -4.1 to -4.5 ms (-10%), 55-58 page
// faults and 45-66 context switches fewer. Set from main instead, it comes
// too late for the initialisation's goroutines (-1.8 ms CPU).
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
